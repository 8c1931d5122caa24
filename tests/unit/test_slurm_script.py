"""scripts/multinode_trainer.slurm with stand-in srun and scontrol: a run that exits 75
(preempted, checkpoint saved) is requeued, any other exit code is passed on as it is."""

import os
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "multinode_trainer.slurm")


def _tool(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("srun_exit,requeued", [(75, True), (0, False), (1, False)])
def test_requeue_on_preemption_only(srun_exit, requeued, tmp_path):
    calls = tmp_path / "calls.log"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _tool(stubs, "srun", f'echo "srun $*" >> {calls}\nexit {srun_exit}\n')
    _tool(stubs, "scontrol", f'if [[ $1 == show ]]; then echo node7; echo node8; else echo "scontrol $*" >> {calls}; fi\n')
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": ROOT}
    proc = subprocess.run(["bash", SCRIPT, "--training.steps=3"], env=env, capture_output=True, text=True)
    assert proc.returncode == srun_exit, proc.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c") and "--training.steps=3" in lines[0]
    assert lines[1:] == (["scontrol requeue 42"] if requeued else [])
    assert ("[slurm] preempted: requeueing job 42" in proc.stdout) == requeued


def test_the_batch_shell_outlives_the_preemption_signal_and_requeues(tmp_path):
    # Slurm signals the batch shell as well: it must wait for srun (the ranks' save), then requeue.
    calls = tmp_path / "calls.log"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _tool(stubs, "srun", f'echo started > {tmp_path}/srun.started\nsleep 1\nexit 75\n')
    _tool(stubs, "scontrol", f'if [[ $1 == show ]]; then echo node7; else echo "scontrol $*" >> {calls}; fi\n')
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node7",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_ID": "43", "SLURM_SUBMIT_DIR": ROOT}
    proc = subprocess.Popen(["bash", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time

    deadline = time.time() + 10
    while not (tmp_path / "srun.started").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(15)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 75, err
    assert "preemption signal: the ranks finish their step and save" in out
    assert calls.read_text().splitlines() == ["scontrol requeue 43"]
