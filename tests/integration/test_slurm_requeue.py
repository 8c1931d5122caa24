"""scripts/multinode_trainer.slurm with stand-ins for srun, scontrol and run_train.sh: a run
whose nodes exit 75 (preempted, checkpoint saved) is requeued and the job exits 75, without
srun seeing a failed task; any other exit code is passed on as it is."""

import os
import stat
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "multinode_trainer.slurm")


def _tool(path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _slurm(tmp_path, train_body: str, job_id: str, nodes: int = 2) -> dict:
    """A submit directory (tmp_path) with a stand-in run_train.sh running `train_body`, srun
    running its task once per node (SLURM_NODEID) and recording the exit codes, scontrol naming
    the nodes and recording the rest of its calls in calls.log."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "calls.log"
    _tool(
        tmp_path / "run_train.sh",
        f'echo "run_train.sh $* @ node $NODE_RANK via $RDZV_ENDPOINT" >> {log}\n' + train_body,
    )
    _tool(
        stubs / "srun",
        "while [[ $1 == --* ]]; do shift; done\nworst=0\n"
        f'for n in $(seq 0 {nodes - 1}); do SLURM_NODEID=$n "$@"; c=$?; echo "task $n exit $c" >> {log};'
        " (( c > worst )) && worst=$c; done\nexit $worst\n",
    )
    _tool(
        stubs / "scontrol",
        f'if [[ $1 == show ]]; then echo node7; echo node8; else echo "scontrol $*" >> {log}; fi\n',
    )
    return {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[7-8]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_ID": job_id,
        "SLURM_SUBMIT_DIR": str(tmp_path),
    }


@pytest.mark.parametrize(
    "train_exit,job_exit,requeued", [(75, 75, True), (0, 0, False), (1, 1, False)]
)
def test_requeue_on_preemption_only(train_exit, job_exit, requeued, tmp_path):
    env = _slurm(tmp_path, f"exit {train_exit}\n", "42")
    proc = subprocess.run(
        ["bash", SCRIPT, "--training.steps=3"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == job_exit, proc.stderr
    lines = (tmp_path / "calls.log").read_text().splitlines()
    task_exit = 0 if train_exit == 75 else train_exit  # a preempted node is no failed task for srun
    assert lines == [
        "run_train.sh --training.steps=3 @ node 0 via node7:29500",
        f"task 0 exit {task_exit}",
        "run_train.sh --training.steps=3 @ node 1 via node7:29500",
        f"task 1 exit {task_exit}",
        *(["scontrol requeue 42"] if requeued else []),
    ]
    assert ("[slurm] preempted: requeueing job 42" in proc.stdout) == requeued
    assert os.listdir(tmp_path / ".torchtitan-slurm") == []  # the markers are gone


def test_the_batch_shell_outlives_the_preemption_signal_and_requeues(tmp_path):
    # Slurm signals the batch shell as well: it must wait for srun (the ranks' save), then requeue.
    env = _slurm(tmp_path, f"touch {tmp_path}/started\nsleep 1\nexit 75\n", "43", nodes=1)
    proc = subprocess.Popen(
        ["bash", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 10
    while not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(15)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 75, err
    assert "preemption signal: the ranks finish their step and save" in out
    assert (tmp_path / "calls.log").read_text().splitlines()[-1] == "scontrol requeue 43"


def test_a_refused_requeue_still_ends_75_with_a_line(tmp_path):
    env = _slurm(tmp_path, "exit 75\n", "44")
    _tool(tmp_path / "bin" / "scontrol", "if [[ $1 == show ]]; then echo node7; else exit 1; fi\n")
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True)
    assert proc.returncode == 75, proc.stderr
    assert "[slurm] requeue refused (a cancelled job?): submit it again to resume" in proc.stdout
