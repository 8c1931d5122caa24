"""The checkpoint folder on disk: which step folders exist, which are complete, which one
a run resumes from. Torch-free, so config validation can answer before any process group.

Layout of <dump_folder>/<checkpoint.folder>:

    step-5/        a complete checkpoint: DCP files, `.metadata`, and `.complete` (JSON)
    step-10.tmp/   a save in progress, or one a crash interrupted: never loaded
    step-0/        a seed checkpoint (weights only, `"model_only": true` in `.complete`)
    step-20.old/   the previous step-20 while a re-save of step 20 is renamed into place
    .trash-*/      checkpoints being deleted (keep_latest_k) in the background

`.complete` is written last, after every rank's DCP files and the DCP metadata, and the
folder is renamed from `step-N.tmp` to `step-N` after that: a step folder without it was
not finished and is reported as incomplete. "Newest" means most recently saved (the
marker's time), so after going back with load_step the new line of checkpoints wins over
the abandoned later steps.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

COMPLETE_MARKER = ".complete"
DCP_METADATA = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)(\.tmp|\.old)?$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line naming its path and the fix."""


@dataclass
class CheckpointInfo:
    step: int
    path: str
    complete: bool
    marker: dict  # contents of .complete ({} when incomplete)

    @property
    def model_only(self) -> bool:
        return bool(self.marker.get("model_only", False))

    @property
    def order(self) -> tuple:
        """Sort key: save time, then step (markers without a time sort by step)."""
        return (self.marker.get("time", 0.0), self.step)


def hf_export_path(dump_folder: str, step: int) -> str:
    """Where checkpoint.last_save_in_hf writes the Hugging Face folder of step `step`."""
    return os.path.join(dump_folder, "hf", f"step-{step}")


def step_path(folder: str, step: int) -> str:
    return os.path.join(folder, f"step-{step}")


def read_marker(path: str) -> dict | None:
    """The .complete record of a step folder, or None when the folder is not complete."""
    marker = os.path.join(path, COMPLETE_MARKER)
    if not os.path.isfile(marker):
        return None
    try:
        with open(marker) as f:
            text = f.read()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        raise CheckpointError(
            f"checkpoint '{path}' has an unreadable {COMPLETE_MARKER} marker; delete the folder or"
            " pick another step with --checkpoint.load_step"
        ) from None


def scan(folder: str) -> list[CheckpointInfo]:
    """Every step folder (complete or not), by step; temporaries count as incomplete. A
    complete `step-N.old` stands in for step-N when a crash hit between the two renames of
    a re-save (step-N itself missing)."""
    if not os.path.isdir(folder):
        return []
    names = set(os.listdir(folder))
    found = []
    for name in names:
        m = _STEP_DIR.match(name)
        path = os.path.join(folder, name)
        if not m or not os.path.isdir(path):
            continue
        if m.group(2) == ".old" and f"step-{m.group(1)}" in names:
            continue  # the re-save finished its rename; this is about to be deleted
        marker = None if m.group(2) == ".tmp" else read_marker(path)
        found.append(CheckpointInfo(int(m.group(1)), path, marker is not None, marker or {}))
    return sorted(found, key=lambda c: (c.step, c.complete))


def newest_first(found: list[CheckpointInfo]) -> list[CheckpointInfo]:
    return sorted(found, key=lambda c: c.order, reverse=True)


def check_loadable(info: CheckpointInfo, others: str = "") -> None:
    """A complete checkpoint must hold DCP's metadata; anything less was damaged after the save."""
    if not os.path.isfile(os.path.join(info.path, DCP_METADATA)):
        raise CheckpointError(
            f"checkpoint '{info.path}' is corrupt: its DCP {DCP_METADATA} file is missing;"
            f" delete the folder or pick an earlier step with --checkpoint.load_step{others}"
        )


def _choices(found: list[CheckpointInfo], exclude: int | None = None) -> str:
    steps = [str(c.step) for c in found if c.complete and not c.model_only and c.step != exclude]
    return f" (complete: {', '.join(steps)})" if steps else " (no other complete checkpoint)"


def resolve_resume(folder: str, load_step: int | str) -> CheckpointInfo | None:
    """The checkpoint a run in `folder` starts from, or None for a fresh start.

    load_step "auto": the most recently saved complete full checkpoint, else a seed (step 0,
    weights only).
    Weights-only exports of later steps are not resumable and are skipped. load_step N:
    exactly step-N, which must be complete; a weights-only step-N is accepted only as a seed.
    """
    found = scan(folder)
    if load_step != "auto":
        matches = [c for c in found if c.step == load_step]
        done = [c for c in matches if c.complete]
        if not done:
            where = matches[0].path if matches else step_path(folder, load_step)
            state = "is incomplete (its save never finished)" if matches else "does not exist"
            raise CheckpointError(
                f"--checkpoint.load_step={load_step}: checkpoint '{where}' {state};"
                f" pick another step{_choices(found, load_step)} or auto for the newest"
            )
        info = done[0]
        if info.model_only and info.step > 0:
            raise CheckpointError(
                f"--checkpoint.load_step={load_step}: '{info.path}' holds weights only (a last_save_model_only"
                " export), not a resumable state; start from its weights with"
                f" --checkpoint.initial_load_path={info.path}"
            )
        check_loadable(info, _choices(found, load_step))
        return info
    full = newest_first([c for c in found if c.complete and not c.model_only])
    seeds = [c for c in found if c.complete and c.model_only and c.step == 0]
    if not full and not seeds:
        return None
    info = full[0] if full else seeds[-1]
    check_loadable(info, _choices(found, info.step))
    return info


def check_initial_load_path(path: str) -> None:
    if not os.path.isdir(path):
        raise CheckpointError(
            f"--checkpoint.initial_load_path: '{path}' is not a folder; give a checkpoint step folder"
            " such as <dump_folder>/checkpoint/step-N"
        )
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        raise CheckpointError(
            f"--checkpoint.initial_load_path: '{path}' holds no DCP checkpoint ({DCP_METADATA} missing);"
            " give a checkpoint step folder such as <dump_folder>/checkpoint/step-N"
        )


def check_compatible(path: str, marker: dict, model: str, global_batch: int | None) -> None:
    """The checkpoint's model (and, for a full resume, its global batch) must be this run's.
    global_batch None: weights only, any batch size is fine."""
    saved_model = marker.get("model")
    if saved_model is not None and saved_model != model:
        name, flavor = saved_model.split("/", 1) if "/" in saved_model else (saved_model, "")
        raise CheckpointError(
            f"checkpoint '{path}' holds model {saved_model}, this run trains {model}: set"
            f" --model.name={name} --model.flavor={flavor}, or use another --checkpoint.folder"
        )
    saved = marker.get("global_batch")
    if global_batch is not None and saved is not None and saved != global_batch:
        raise CheckpointError(
            f"checkpoint '{path}' was saved with global batch {saved} rows, this run has {global_batch}:"
            f" the data position cannot be carried over; set --training.global_batch_size={saved}, start the"
            " data over with --checkpoint.exclude_from_loading=dataloader, or start from its weights with"
            f" --checkpoint.initial_load_path={path} and a fresh --checkpoint.folder"
        )


def run_record(
    model: str,
    world_size: int,
    mesh: dict,
    tokenizer_path: str,
    hf_args: dict,
    *,
    model_rules: dict,
    global_batch: int | None = None,
) -> dict:
    """What every marker of a run says about the run: the model ("name/flavor"), the layout
    (world size, mesh; RNG states load only into the same one), the global batch (None for
    weights only; a resume must keep it), the tokenizer, and what an export and a run started
    from it need of the model's args (hf_args, model_rules: models/hf/converters.py)."""
    return {
        "world_size": world_size,
        "global_batch": global_batch,
        "model": model,
        "mesh": mesh,
        "tokenizer": os.path.abspath(tokenizer_path),
        "hf_args": hf_args,
        "model_rules": model_rules,
    }


def marker_record(step: int, model_only: bool, dtype: str, run: dict, **extra) -> dict:
    """The `.complete` record of step-N: the step, whether it holds weights only (and their
    dtype), the run (run_record) and anything `extra` (e.g. hf_source). write_marker stamps
    the time."""
    return {"step": step, "model_only": model_only, "dtype": dtype, **run, **extra}


def marker_rules(path: str) -> dict:
    """The model rules a checkpoint's marker recorded (a model that came from a Hugging Face
    folder keeps its YaRN rule through convert_hf.py and through training checkpoints); {}
    when it has none or cannot be read (the checks report that)."""
    try:
        marker = read_marker(path) or {}
    except (CheckpointError, OSError):
        return {}
    return dict(marker.get("model_rules") or {})


# The parts of a full checkpoint besides the model, by their names in exclude_from_loading.
LOADABLE_PARTS = ("optimizer", "lr_scheduler", "dataloader", "train_state")


@dataclass(frozen=True)
class StartPoint:
    """What a run starts from (start_point)."""

    # "fresh", "resume", "seed", "initial_checkpoint" (weights), "initial_full" (another run's
    # full checkpoint) or "initial_hf"
    kind: str
    path: str = ""
    info: CheckpointInfo | None = (
        None  # resume / seed / initial_full: the checkpoint and its marker
    )
    key: str = "--checkpoint.initial_load_path"  # the key that named `path` (initial_hf)


def _hf_twin(path: str) -> str:
    """The Hugging Face export of checkpoint `path` (last_save_in_hf), named by its marker; ""."""
    from torchtitan.models.hf.folder import is_hf_folder

    try:
        hf = (read_marker(path) or {}).get("hf_export", "")
    except CheckpointError:
        return ""
    return hf if hf and is_hf_folder(hf) else ""


def _not_hf(path: str, key: str) -> str:
    """initial_load_in_hf on a folder that is not a Hugging Face one: what it is, and the fix."""
    from torchtitan.models.hf.folder import CONFIG

    what = (
        f"has no {CONFIG}"
        if not os.path.isfile(os.path.join(path, CONFIG))
        else "has no *.safetensors"
    )
    try:
        hf = (read_marker(path) or {}).get("hf_export", "")
    except CheckpointError:
        hf = ""
    if hf:  # this fork's last_save_in_hf writes the folder next to the checkpoints (upstream: in step-N)
        fix = (
            f"its weights were exported by checkpoint.last_save_in_hf to '{hf}': point {key} there"
        )
    elif os.path.isfile(os.path.join(path, DCP_METADATA)):
        fix = "it is a DCP checkpoint: drop --checkpoint.initial_load_in_hf to load it"
    else:
        fix = "give a Hugging Face model folder (config.json + *.safetensors)"
    return f"--checkpoint.initial_load_in_hf: {key} '{path}' {what}, it is not a Hugging Face model folder; {fix}"


def _initial_full(path: str, marker: dict | None) -> CheckpointInfo:
    """initial_load_model_only=false: `path` must be a complete full checkpoint."""
    flag = "--checkpoint.initial_load_model_only=false"
    if marker is None:
        raise CheckpointError(
            f"{flag}: '{path}' has no {COMPLETE_MARKER} marker (an unfinished save, or not a checkpoint"
            " of this trainer), so its training state is not loaded; give a complete step-N folder, or"
            " load only its weights with --checkpoint.initial_load_model_only=true"
        )
    if marker.get("model_only", False):
        raise CheckpointError(
            f"{flag}: '{path}' holds weights only (no optimizer, schedule or data position); load it"
            " with --checkpoint.initial_load_model_only=true"
        )
    return CheckpointInfo(int(marker.get("step", 0)), path, True, marker)


def start_point(
    folder: str,
    c,
    model_name: str,
    *,
    flavor: str,
    args,
    global_batch: int,
    hf_assets_path: str = "",
) -> StartPoint:
    """What a run in `folder` starts from, by the [checkpoint] section `c`, each candidate
    checked (CheckpointError, one line): with checkpointing on, the checkpoint resolve_resume
    picks (its model and, for a full resume that loads the data position, its global batch
    must be this run's); else `initial_load_path` (with initial_load_in_hf and none given,
    `hf_assets_path`, as upstream): a Hugging Face folder (its config and shapes against
    `args`, the run's model args), or a checkpoint step folder - its weights, or with
    initial_load_model_only=false its whole training state; else a fresh start. The checks and
    the checkpoint manager (on rank 0, for every rank) both decide with it."""
    from torchtitan.models.hf.folder import HFFolderError, check_folder, is_hf_folder

    model = f"{model_name}/{flavor}"
    data_batch = None if "dataloader" in c.exclude_from_loading else global_batch
    info = resolve_resume(folder, c.load_step) if c.enable else None
    if info is not None:
        check_compatible(info.path, info.marker, model, None if info.model_only else data_batch)
        return StartPoint("seed" if info.model_only else "resume", info.path, info)
    path, key = c.initial_load_path, "--checkpoint.initial_load_path"
    if not path and c.initial_load_in_hf:
        path, key = hf_assets_path, "--model.hf_assets_path"
    if not path:
        return StartPoint("fresh")
    if c.initial_load_in_hf and not is_hf_folder(path):
        # upstream's last_save_in_hf writes the Hugging Face folder as step-N itself, so its
        # users point here at the step; this fork wrote it beside (the marker names it)
        path = _hf_twin(path) or path
        if not is_hf_folder(path):
            raise CheckpointError(_not_hf(path, key))
    if is_hf_folder(path):
        if not c.initial_load_model_only:
            raise CheckpointError(
                f"--checkpoint.initial_load_model_only=false: {key} '{path}' is a Hugging Face folder,"
                " which holds weights only; set --checkpoint.initial_load_model_only=true"
            )
        if args is None:
            raise CheckpointError(
                f"{key}: '{path}' is a Hugging Face folder, which this"
                " run cannot read (no model args to check it against)"
            )
        try:
            check_folder(path, model_name, flavor, args, key=key)
        except HFFolderError as e:
            raise CheckpointError(str(e)) from None
        return StartPoint("initial_hf", path, key=key)
    check_initial_load_path(path)
    marker = read_marker(path)
    if c.initial_load_model_only:
        check_compatible(path, marker or {}, model, None)
        return StartPoint("initial_checkpoint", path)
    info = _initial_full(path, marker)
    check_compatible(path, info.marker, model, data_batch)
    return StartPoint("initial_full", path, info)


def write_marker(path: str, record: dict) -> None:
    """`.complete` into the step folder `path` (written last: the folder then counts), with the
    time of writing unless `record` has one."""
    with open(os.path.join(path, COMPLETE_MARKER), "w") as f:
        json.dump({**record, "time": record.get("time", time.time())}, f)
        f.flush()
        os.fsync(f.fileno())
