"""Which checkpoint a run resumes from, and the errors for missing, incomplete and corrupt ones."""

import json
import os

import pytest

from torchtitan.checkpoint.files import (
    CheckpointError,
    check_compatible,
    check_initial_load_path,
    resolve_resume,
    scan,
)


def make_step(
    folder,
    step,
    complete=True,
    model_only=False,
    metadata=True,
    tmp=False,
    saved_at=None,
    suffix="",
):
    path = folder / (f"step-{step}" + (".tmp" if tmp else suffix))
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x")
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    if complete:
        marker = {
            "step": step,
            "model_only": model_only,
            "global_batch": 8,
            "model": "llama3/tiny",
            "time": float(step if saved_at is None else saved_at),
        }
        (path / ".complete").write_text(json.dumps(marker))
    return path


def test_empty_or_missing_folder_is_a_fresh_start(tmp_path):
    assert resolve_resume(str(tmp_path / "none"), "auto") is None
    assert resolve_resume(str(tmp_path), "auto") is None


def test_newest_complete_full_checkpoint_wins(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10)
    make_step(tmp_path, 15, tmp=True, complete=False)  # a save a crash interrupted
    make_step(tmp_path, 20, complete=False)  # renamed but never marked: incomplete
    make_step(tmp_path, 25, model_only=True)  # an export: not resumable
    info = resolve_resume(str(tmp_path), "auto")
    assert info.step == 10 and not info.model_only
    assert [c.step for c in scan(str(tmp_path)) if c.complete] == [5, 10, 25]
    assert [(c.step, c.complete) for c in scan(str(tmp_path))] == [
        (5, True),
        (10, True),
        (15, False),
        (20, False),
        (25, True),
    ]


def test_seed_is_used_only_without_full_checkpoints(tmp_path):
    make_step(tmp_path, 0, model_only=True)
    assert resolve_resume(str(tmp_path), "auto").step == 0
    make_step(tmp_path, 3)
    assert resolve_resume(str(tmp_path), "auto").step == 3
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
    with pytest.raises(
        CheckpointError,
        match=r"step-10\.tmp' is incomplete \(its save never finished\); pick another step \(complete: 5\)",
    ):
        resolve_resume(str(tmp_path), 10)


def test_load_step_of_an_export_points_to_initial_load_path(tmp_path):
    p = make_step(tmp_path, 10, model_only=True)
    with pytest.raises(CheckpointError, match=f"--checkpoint.initial_load_path={p}"):
        resolve_resume(str(tmp_path), 10)


def test_marked_checkpoint_without_metadata_is_corrupt(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10, metadata=False)
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(tmp_path), "auto")
    assert f"'{tmp_path}/step-10' is corrupt" in str(e.value) and "(complete: 5)" in str(e.value)


def test_unreadable_marker_is_reported(tmp_path):
    p = make_step(tmp_path, 5)
    (p / ".complete").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable .complete marker"):
        resolve_resume(str(tmp_path), "auto")


def test_initial_load_path_must_be_a_dcp_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is not a folder"):
        check_initial_load_path(str(tmp_path / "nope"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(CheckpointError, match=r"holds no DCP checkpoint \(.metadata missing\)"):
        check_initial_load_path(str(tmp_path / "empty"))
    check_initial_load_path(str(make_step(tmp_path, 3)))


def test_after_going_back_the_new_line_of_checkpoints_wins(tmp_path):
    # Saved 10, 20, 30; the run went back to 10 (load_step) and has since saved 15.
    make_step(tmp_path, 10, saved_at=1)
    make_step(tmp_path, 20, saved_at=2)
    make_step(tmp_path, 30, saved_at=3)
    make_step(tmp_path, 15, saved_at=4)
    assert resolve_resume(str(tmp_path), "auto").step == 15


def test_old_copy_stands_in_when_a_resave_crashed_between_renames(tmp_path):
    make_step(tmp_path, 5)
    make_step(tmp_path, 10, suffix=".old")  # step-10 renamed away, new one not yet in place
    make_step(tmp_path, 10, tmp=True)  # the new save, marked but not renamed: not trusted
    info = resolve_resume(str(tmp_path), "auto")
    assert info.step == 10 and info.path.endswith("step-10.old")
    make_step(tmp_path, 10)  # once step-10 exists, the .old copy is ignored
    assert resolve_resume(str(tmp_path), "auto").path.endswith("step-10")


def test_checkpoint_of_another_model_or_batch_is_refused():
    marker = {"model": "llama3/tiny", "global_batch": 8}
    check_compatible("/c/step-5", marker, "llama3/tiny", 8)
    check_compatible("/c/step-5", marker, "llama3/tiny", None)  # weights only: any batch
    with pytest.raises(
        CheckpointError,
        match="holds model llama3/tiny, this run trains llama3/8B: set --model.name=llama3 --model.flavor=tiny",
    ):
        check_compatible("/c/step-5", marker, "llama3/8B", 8)
    with pytest.raises(
        CheckpointError, match="was saved with global batch 8 rows, this run has 16"
    ):
        check_compatible("/c/step-5", marker, "llama3/tiny", 16)
