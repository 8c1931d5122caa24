"""fast_launch.py, the default launcher of the integration tests, gives every rank what
run_train.sh and torchrun give it (environment, threads, argv, log files, console) and ends
runs as torchrun does: a failed rank stops the others, a timeout stops everything.
Probed with launch_probe.py instead of a training run (a run takes seconds, a probe less)."""

import json
import os
import signal
import threading

import checkpoint_checks
import fast_launch
import pytest
import run_tests

ROOT = fast_launch.ROOT


def _launch(
    tmp_path, ngpu: int, actions: list[str], extra_env: dict | None = None, timeout: float = 120
):
    tmp_path.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LOG_RANK")}
    env.update({"NGPU": str(ngpu), **(extra_env or {})})
    rc, console = fast_launch.launch(
        ngpu,
        [str(tmp_path), *actions],
        str(tmp_path / "ranks"),
        env,
        timeout,
        entry="launch_probe",
        with_config=False,
    )
    seen = {
        r: json.loads((tmp_path / f"rank{r}.json").read_text())
        for r in range(ngpu)
        if (tmp_path / f"rank{r}.json").exists()
    }
    return rc, console, seen


def test_ranks_get_the_environment_threads_and_argv_of_run_train_sh(tmp_path):
    rc, console, seen = _launch(tmp_path, 2, ["print"], {"TITAN_PROBE": "given"})
    assert rc == 0, console
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # run_train.sh: cores / NGPU
    for rank in (0, 1):
        env = seen[rank]["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the launcher hosts the store
        assert env["TITAN_PROBE"] == "given" and env["PYTHONUNBUFFERED"] == "1"
        assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
        assert env["OMP_NUM_THREADS"] == str(threads) and seen[rank]["threads"] == threads
        assert seen[rank]["argv"] == [str(tmp_path), "print"] and seen[rank]["cwd"] == os.getcwd()
        # forked from the process that imported torchtitan (this checkout's) once
        assert seen[rank]["preloaded"] and seen[rank]["torchtitan"].startswith(ROOT + os.sep)
    assert seen[0]["pid"] != seen[1]["pid"]
    # The console is rank 0's stdout and stderr (LOG_RANK's default), each rank's also in files.
    assert sorted(console.splitlines()) == ["err 0", "out 0 a", "out 0 b"], console
    assert (tmp_path / "ranks/1/stdout.log").read_text() == "out 1 a\nout 1 b\n"
    assert (tmp_path / "ranks/1/stderr.log").read_text() == "err 1\n"


@pytest.mark.parametrize("log_rank, shown", [("1", [1]), ("0,1", [0, 1])])
def test_log_rank_picks_the_console_and_omp_num_threads_is_kept(tmp_path, log_rank, shown):
    rc, console, seen = _launch(
        tmp_path, 2, ["print"], {"LOG_RANK": log_rank, "OMP_NUM_THREADS": "1"}
    )
    assert rc == 0, console
    assert sorted(console.splitlines()) == sorted(
        f"{k} {r}{s}" for r in shown for k, s in (("out", " a"), ("out", " b"), ("err", ""))
    )
    assert all(s["threads"] == 1 and s["env"]["LOG_RANK"] == log_rank for s in seen.values())


def test_a_failed_rank_stops_the_others_like_torchrun(tmp_path):
    # rank 1 fails at once; the others then get SIGKILL, as torchtitan/launcher.py has torchrun
    # stop them (rank 2 would ignore a SIGTERM); the summary has torchrun's "rank : / exitcode :" lines.
    rc, console, seen = _launch(
        tmp_path, 3, ["ignore_sigterm", "2", "exit", "1", "3", "sleep", "60"]
    )
    assert rc == 1, console
    assert checkpoint_checks.rank_exit_codes(console) == {0: -9, 1: 3, 2: -9}, console
    assert "rank 1 exited first (exit code 3)" in console
    assert not any(checkpoint_checks._running(s["pid"]) for s in seen.values())


def test_a_rank_leaves_like_an_interpreter_with_an_idle_thread_pool(tmp_path):
    # Inductor's compile workers are a ThreadPoolExecutor: its threads wait for work until
    # threading's exit hooks tell them to stop; joining them first would wait forever.
    rc, console, _ = _launch(tmp_path, 2, ["thread_pool"], timeout=60)
    assert rc == 0 and console == "pool 0\n", console


def test_a_config_error_exits_2_as_run_train_sh_does(tmp_path):
    rc, console, _ = _launch(tmp_path, 2, ["exit", "-1", "2"])  # load_config_or_exit on every rank
    assert rc == 2, console
    rc, console, _ = _launch(tmp_path, 2, ["exit", "0", "1", "sleep", "30", "exit", "1", "2"])
    assert rc == 1, console


def test_timeout_kills_every_rank_and_exits_124(tmp_path):
    rc, console, seen = _launch(tmp_path, 2, ["ignore_sigterm", "-1", "sleep", "60"], timeout=3)
    assert rc == 124, console
    assert sorted(seen) == [0, 1] and not any(
        checkpoint_checks._running(s["pid"]) for s in seen.values()
    )


def test_runs_use_the_fast_launcher_unless_an_import_time_variable_changes(monkeypatch):
    monkeypatch.delenv("TITAN_TEST_LAUNCHER", raising=False)
    fast_launch._context()  # the fork server's environment is this process's from now on
    env = run_tests.run_env(2, "/x/ranks", {"LOG_RANK": "0,1"})  # what run() launches with
    assert run_tests.chosen_launcher(env) == "fast" and fast_launch.needs_torchrun(env) == []
    assert run_tests.chosen_launcher(env, "torchrun") == "torchrun"
    changed = run_tests.run_env(
        2, "/x/ranks", {"HF_TITAN_PROBE": "1", "TORCHINDUCTOR_TITAN_PROBE": "1"}
    )
    assert fast_launch.needs_torchrun(changed) == ["HF_TITAN_PROBE", "TORCHINDUCTOR_TITAN_PROBE"]
    assert run_tests.chosen_launcher(changed) == "torchrun"
    monkeypatch.setenv("TITAN_TEST_LAUNCHER", "torchrun")
    assert run_tests.chosen_launcher(env) == "torchrun"
    monkeypatch.setenv("TITAN_TEST_LAUNCHER", "forkserver")
    with pytest.raises(ValueError, match="TITAN_TEST_LAUNCHER"):
        run_tests.chosen_launcher(env)


def test_a_dead_fork_server_is_reported_and_replaced(tmp_path):
    assert _launch(tmp_path / "warm", 1, [])[0] == 0  # the server is up and has imported
    server = fast_launch._server_pid
    killer = threading.Timer(1, os.kill, (server, signal.SIGKILL))  # while the ranks sleep
    killer.start()
    rc, console, seen = _launch(tmp_path / "a", 2, ["sleep", "60"])
    killer.join()
    assert rc == 1 and f"the fork server (pid {server}) died during this run" in console, console
    assert f"fork server {server}: ready" in console  # the end of its log
    assert sorted(seen) == [0, 1] and not any(
        checkpoint_checks._running(s["pid"]) for s in seen.values()
    )
    rc, console, seen = _launch(tmp_path / "b", 2, [])  # a new server, which preloads again
    assert rc == 0 and fast_launch._server_pid != server, console
    assert all(s["preloaded"] for s in seen.values())
