"""The library's logging (torchtitan/log.py): INFO to stdout, WARNING up to stderr, the bare
message, the rank on every record, and no print left in the library but the two CLI answers."""

import ast
import logging
import os

from torchtitan import log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# printed, not logged: run_train.sh reads the launch mode from stdout; --help is the program's output
PRINTS_ALLOWED = {"torchtitan/checks/__main__.py", "torchtitan/config/manager.py"}


def test_info_goes_to_stdout_warnings_to_stderr_as_the_bare_message(capsys):
    log.setup(rank=3)
    logger = logging.getLogger("torchtitan.some.module")
    logger.info("step 1 loss 2.5")
    logger.warning("warning: something")
    out, err = capsys.readouterr()
    assert out == "step 1 loss 2.5\n"
    assert err == "warning: something\n"
    log.setup()


def test_every_record_carries_the_rank():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    log.setup(rank=5)
    logger = logging.getLogger("torchtitan")
    keep = Keep()
    keep.addFilter(log._HANDLERS[0].filters[-1])  # the rank stamp the console handlers use
    logger.addHandler(keep)
    try:
        logging.getLogger("torchtitan.x").info("hello")
    finally:
        logger.removeHandler(keep)
        log.setup()
    assert [(r.getMessage(), r.rank) for r in seen] == [("hello", 5)]


def test_no_print_in_the_library():
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "torchtitan")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, ROOT)
            with open(path) as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "print"
                    and rel not in PRINTS_ALLOWED
                ):
                    found.append(f"{rel}:{node.lineno}")
    assert found == []
