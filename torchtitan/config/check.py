"""`python -m torchtitan.config.check [overrides]`: validate a config without torch.

run_train.sh calls this before torchrun so a bad key fails in a fraction of a second with
one line, instead of once per worker. The world size comes from $NGPU.
"""

import os
import sys

from torchtitan.config import load_config_or_exit


def main() -> None:
    world_size = int(os.environ.get("NGPU", os.environ.get("WORLD_SIZE", "1")))
    load_config_or_exit(sys.argv[1:], world_size)


if __name__ == "__main__":
    main()
