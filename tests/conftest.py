"""Every test runs on CPU ranks (gloo) unless TORCHTITAN_TEST_DEVICE=cuda: hiding the GPUs
keeps `make test` meaning the same on a GPU machine (e.g. the stalled-rank test needs gloo's
error path; NCCL's watchdog aborts instead). The GPU suite is
`tests/integration/run_tests.py --device cuda`."""

import os

if os.environ.get("TORCHTITAN_TEST_DEVICE", "cpu") == "cpu":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
