#!/usr/bin/env python3
"""The bad-input catalogue: each case is a run_train.sh command that must fail with one line
naming the key or path and the fix, exit non-zero, start no process group and leave the
dump folder exactly as it was.

    python tests/integration/bad_inputs.py      # prints every case and its error line

test_bad_inputs.py runs the same cases under pytest.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_tests  # noqa: E402


def _ckpt_file(dump):  # the checkpoint folder path is taken by a file
    with open(os.path.join(dump, "checkpoint"), "w") as f:
        f.write("not a folder")


def _step(dump, step, marker=None, metadata=True):
    path = os.path.join(dump, "checkpoint", f"step-{step}")
    os.makedirs(path)
    if metadata:
        open(os.path.join(path, ".metadata"), "wb").close()
    if marker is not None:
        with open(os.path.join(path, ".complete"), "w") as f:
            json.dump(marker, f)


@dataclass
class BadInput:
    name: str
    args: list[str]
    expect: str  # a substring of the error line
    ngpu: int = 2
    setup: Callable[[str], None] | None = None
    extra: list[str] = field(default_factory=list)


CASES = [
    BadInput("unknown key", ["--parallelism.tensor_parallel_degre=2"],
             "unknown config key 'parallelism.tensor_parallel_degre' (did you mean 'parallelism.tensor_parallel_degree'?)"),
    BadInput("bad enum", ["--parallelism.fsdp_implementation=fsdp3"],
             "--parallelism.fsdp_implementation: invalid value 'fsdp3'; choose one of 'fsdp2', 'simple_fsdp'"),
    BadInput("wrong type", ["--training.steps=ten"], "--training.steps"),
    BadInput("degrees vs world size", ["--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=4"],
             "but the world size is 4", ngpu=4),
    BadInput("TP degree vs heads", ["--parallelism.tensor_parallel_degree=3"],
             "--parallelism.tensor_parallel_degree=3 does not divide llama3 debugmodel n_heads=16", ngpu=3),
    BadInput("layers vs stages", ["--parallelism.pipeline_parallel_degree=4"],
             "6 layers do not split evenly into 4 stages", ngpu=4),
    BadInput("batch vs microbatches", ["--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=3",
                                       "--parallelism.pipeline_parallel_microbatch_size=2"],
             "--training.local_batch_size=3 does not split into microbatches of --parallelism.pipeline_parallel_microbatch_size=2"),
    BadInput("missing dataset path", ["--training.dataset=./no/such/data.jsonl"],
             "--training.dataset: local dataset path './no/such/data.jsonl' does not exist"),
    BadInput("missing tokenizer", ["--model.tokenizer_path=/no/such/tokenizer.json"],
             "--model.tokenizer_path: '/no/such/tokenizer.json' not found"),
    BadInput("checkpoint folder is a file", ["--checkpoint.enable=true"], "--checkpoint.folder: '", setup=_ckpt_file),
    BadInput("load_step not there", ["--checkpoint.enable=true", "--checkpoint.load_step=5"],
             "--checkpoint.load_step=5: checkpoint '", setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 16})),
    BadInput("corrupt checkpoint", ["--checkpoint.enable=true"], "is corrupt: its DCP .metadata file is missing",
             setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 16}, metadata=False)),
    BadInput("checkpoint of another batch", ["--checkpoint.enable=true"], "was saved with global batch 64 rows, this run has 8",
             setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 64})),
    BadInput("seed checkpoint on 2 ranks", ["--checkpoint.create_seed_checkpoint=true"],
             "--checkpoint.create_seed_checkpoint runs on one rank, not 2: use NGPU=1"),
]


def snapshot(folder: str) -> dict[str, str]:
    """Every file under folder -> hash of its bytes (and its mtime), to prove nothing changed."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.isdir(path):
                out[rel + "/"] = ""
            else:
                with open(path, "rb") as f:
                    out[rel] = f"{hashlib.sha256(f.read()).hexdigest()} {os.stat(path).st_mtime_ns}"
    return out


def run_case(case: BadInput, dump: str) -> tuple[int, list[str], dict, dict]:
    """Run the case against a dump folder that already holds a previous run's files."""
    os.makedirs(dump, exist_ok=True)
    with open(os.path.join(dump, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "loss": 9.0}\n')
    if case.setup:
        case.setup(dump)
    before = snapshot(dump)
    env = {**os.environ, "NGPU": str(case.ngpu)}
    proc = subprocess.run([run_tests.RUN_TRAIN, *case.args, f"--job.dump_folder={dump}"],
                          env=env, capture_output=True, text=True)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, lines, before, snapshot(dump)


def main() -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(CASES):
            rc, lines, before, after = run_case(case, os.path.join(tmp, f"case{i}"))
            ok = rc != 0 and len(lines) == 1 and case.expect in lines[0] and before == after
            failed += not ok
            print(f"[{'ok' if ok else 'FAIL'}] {case.name} (NGPU={case.ngpu} {' '.join(case.args)}): exit {rc}, "
                  f"dump folder {'unchanged' if before == after else 'CHANGED'}")
            for line in lines:
                print(f"    {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
