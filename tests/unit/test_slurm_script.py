"""scripts/multinode_trainer.slurm with stand-in srun and scontrol: a run that exits 75
(preempted, checkpoint saved) is requeued, any other exit code is passed on as it is."""

import os
import stat
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "multinode_trainer.slurm")


def _slurm(tmp_path, srun_body: str, job_id: str) -> dict:
    """Stand-ins on PATH (srun runs `srun_body`; scontrol names two nodes and records the
    rest of its calls in calls.log) and the environment of a 2-node job `job_id`."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("srun", srun_body), ("scontrol", 'if [[ $1 == show ]]; then echo node7; echo node8; else'
                                                         f' echo "scontrol $*" >> {tmp_path}/calls.log; fi\n')):
        (stubs / name).write_text("#!/bin/bash\n" + body)
        (stubs / name).chmod((stubs / name).stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[7-8]",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": job_id, "SLURM_SUBMIT_DIR": ROOT}


@pytest.mark.parametrize("srun_exit,requeued", [(75, True), (0, False), (1, False)])
def test_requeue_on_preemption_only(srun_exit, requeued, tmp_path):
    env = _slurm(tmp_path, f'echo "srun $* @ $RDZV_ENDPOINT" >> {tmp_path}/calls.log\nexit {srun_exit}\n', "42")
    proc = subprocess.run(["bash", SCRIPT, "--training.steps=3"], env=env, capture_output=True, text=True)
    assert proc.returncode == srun_exit, proc.stderr
    lines = (tmp_path / "calls.log").read_text().splitlines()
    assert lines[0].startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c") and "--training.steps=3" in lines[0]
    assert lines[0].endswith("@ node7:29500")  # the rendezvous on the first node of the allocation
    assert lines[1:] == (["scontrol requeue 42"] if requeued else [])
    assert ("[slurm] preempted: requeueing job 42" in proc.stdout) == requeued


def test_the_batch_shell_outlives_the_preemption_signal_and_requeues(tmp_path):
    # Slurm signals the batch shell as well: it must wait for srun (the ranks' save), then requeue.
    env = _slurm(tmp_path, f"echo started > {tmp_path}/srun.started\nsleep 1\nexit 75\n", "43")
    proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    while not (tmp_path / "srun.started").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(15)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 75, err
    assert "preemption signal: the ranks finish their step and save" in out
    assert (tmp_path / "calls.log").read_text().splitlines() == ["scontrol requeue 43"]
