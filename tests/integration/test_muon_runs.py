"""Muon's state through a checkpoint (optimizer.name = Muon): FSDP 2 ranks saved at step 3 and
resumed trains steps 4..6 as the straight run did, bitwise (Muon's momentum buffers, AdamW's
moments, each optimizer's own lr schedule); the layouts' parity with one rank is the parity
suite's muon_* cases."""

import os
import shutil

import run_tests

MUON = [
    "--model.flavor=tiny",
    "--training.steps=6",
    "--optimizer.name=Muon",
    "--optimizer.muon_lr=0.02",
    "--checkpoint.enable",
    "--checkpoint.interval=3",
]


def test_muon_resumes_bitwise(tmp_path):
    dump = str(tmp_path)
    rc, _, log = run_tests.run(2, [*MUON, f"--job.dump_folder={dump}"], dump)
    assert rc == 0, log[-3000:]
    first = (run_tests.read_losses(dump), run_tests.read_grad_norms(dump))
    os.rename(os.path.join(dump, "metrics.jsonl"), os.path.join(dump, "first.jsonl"))
    shutil.rmtree(os.path.join(dump, "checkpoint", "step-6"))
    rc, _, log = run_tests.run(2, [*MUON, f"--job.dump_folder={dump}"], dump)
    assert rc == 0 and "resumed from step 3" in log, log[-3000:]
    again = (run_tests.read_losses(dump), run_tests.read_grad_norms(dump))
    assert again == (first[0][3:], first[1][3:])
