"""Every test runs on CPU ranks (gloo) unless TORCHTITAN_TEST_DEVICE=cuda: hiding the GPUs
keeps `make test` meaning the same on a GPU machine (e.g. the stalled-rank test needs gloo's
error path; NCCL's watchdog aborts instead). The GPU suite is
`tests/integration/run_tests.py --device cuda`."""

import os

if os.environ.get("TORCHTITAN_TEST_DEVICE", "cpu") == "cpu":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# No `local` hardware profile unless a test hands one over: a dry run would otherwise measure
# this machine (a minute) and every start-up prediction would time the step (memory/local_profile.py)
os.environ.setdefault("TITAN_PROFILE_CACHE", "none")

# The library logs through logging; the entry points set its console up, and so do the tests
# that call library functions in-process (their lines land in pytest's captured stdout).
from torchtitan import log  # noqa: E402

log.setup()


def pytest_collection_finish(session):
    """With integration tests to run, start their launcher's fork server (fast_launch.py) now:
    it imports torch and torchtitan in the background while the first tests run."""
    integration = os.path.join(os.path.dirname(os.path.abspath(__file__)), "integration")
    if session.config.option.collectonly or os.environ.get("TITAN_TEST_LAUNCHER") == "torchrun":
        return
    if any(str(item.path).startswith(integration + os.sep) for item in session.items):
        import fast_launch  # tests/integration/conftest.py put it on the path

        fast_launch.start()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Beside --durations' slowest tests: the slowest test files, setup + call + teardown of
    all their tests (a session fixture's set-up counts where it is first used)."""
    from collections import Counter

    totals: Counter = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown") and hasattr(
                report, "duration"
            ):
                totals[report.nodeid.split("::")[0]] += report.duration
    if not totals:
        return
    terminalreporter.write_sep(
        "=", "slowest 10 test files (setup + call + teardown of their tests)"
    )
    for path, seconds in totals.most_common(10):
        terminalreporter.write_line(f"{seconds:8.2f}s {path}")
    terminalreporter.write_line(f"{sum(totals.values()):8.2f}s in all {len(totals)} files")
