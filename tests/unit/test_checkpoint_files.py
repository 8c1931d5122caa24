"""Which checkpoint a run resumes from, and the errors for missing, incomplete and corrupt ones."""

import json
import os

import pytest

from torchtitan.components.checkpoint_files import (
    CheckpointError,
    check_initial_load_path,
    completed_steps,
    resolve_resume,
    scan,
)


def make_step(folder, step, complete=True, model_only=False, metadata=True, tmp=False):
    path = folder / (f"step-{step}" + (".tmp" if tmp else ""))
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x")
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    if complete:
        (path / ".complete").write_text(json.dumps({"step": step, "model_only": model_only, "global_batch": 8}))
    return path


def test_empty_or_missing_folder_is_a_fresh_start(tmp_path):
    assert resolve_resume(str(tmp_path / "none"), -1) is None
    assert resolve_resume(str(tmp_path), -1) is None


def test_newest_complete_full_checkpoint_wins(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10)
    make_step(tmp_path, 15, tmp=True, complete=False)  # a save a crash interrupted
    make_step(tmp_path, 20, complete=False)  # renamed but never marked: incomplete
    make_step(tmp_path, 25, model_only=True)  # an export: not resumable
    info = resolve_resume(str(tmp_path), -1)
    assert info.step == 10 and not info.model_only
    assert completed_steps(str(tmp_path)) == [5, 10, 25]
    assert [(c.step, c.complete) for c in scan(str(tmp_path))] == [(5, True), (10, True), (15, False), (20, False), (25, True)]


def test_seed_is_used_only_without_full_checkpoints(tmp_path):
    make_step(tmp_path, 0, model_only=True)
    assert resolve_resume(str(tmp_path), -1).step == 0
    make_step(tmp_path, 3)
    assert resolve_resume(str(tmp_path), -1).step == 3
    assert resolve_resume(str(tmp_path), 0).model_only


def test_load_step_picks_an_earlier_one(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10)
    assert resolve_resume(str(tmp_path), 5).step == 5


def test_load_step_missing_names_path_and_choices(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10)
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(tmp_path), 7)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"'{tmp_path}/step-7' does not exist" in msg and "(complete: 5, 10)" in msg


def test_load_step_incomplete_names_the_temporary(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10, tmp=True, complete=False)
    with pytest.raises(CheckpointError, match=r"step-10\.tmp' is incomplete \(its save never finished\); pick another step \(complete: 5\)"):
        resolve_resume(str(tmp_path), 10)


def test_load_step_of_an_export_points_to_initial_load_path(tmp_path):
    p = make_step(tmp_path, 10, model_only=True)
    with pytest.raises(CheckpointError, match=f"--checkpoint.initial_load_path={p}"):
        resolve_resume(str(tmp_path), 10)


def test_marked_checkpoint_without_metadata_is_corrupt(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10, metadata=False)
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(tmp_path), -1)
    assert f"'{tmp_path}/step-10' is corrupt" in str(e.value) and "(complete: 5)" in str(e.value)


def test_unreadable_marker_is_reported(tmp_path):
    p = make_step(tmp_path, 5)
    (p / ".complete").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable .complete marker"):
        resolve_resume(str(tmp_path), -1)


def test_initial_load_path_must_be_a_dcp_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is not a folder"):
        check_initial_load_path(str(tmp_path / "nope"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(CheckpointError, match=r"holds no DCP checkpoint \(.metadata missing\)"):
        check_initial_load_path(str(tmp_path / "empty"))
    check_initial_load_path(str(make_step(tmp_path, 3)))
