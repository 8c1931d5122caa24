"""`python -m torchtitan.checks [overrides]`: check a job before launch, without torch.

run_train.sh calls this before torchrun so a bad key fails in a fraction of a second with
one line, instead of once per worker. The world size comes from $NGPU, the ranks on this
node (which share its memory budget) from $LOCAL_WORLD_SIZE (run_train.sh: NGPU per node). With
TORCHTITAN_PRINT_MODE=1 it prints how to launch: "train" (torchrun) or "dry_run" (one process).
"""

import os
import sys

from torchtitan import log
from torchtitan.checks import load_config_or_exit


def main() -> None:
    log.setup()
    world_size = int(os.environ.get("NGPU", os.environ.get("WORLD_SIZE", "1")))
    cfg = load_config_or_exit(sys.argv[1:], world_size)
    if os.environ.get("TORCHTITAN_PRINT_MODE") == "1":  # run_train.sh asks how to launch
        # the answer run_train.sh reads from stdout, not a log line: printed as it is
        print("dry_run" if cfg.job.dry_run else "train")


if __name__ == "__main__":
    main()
