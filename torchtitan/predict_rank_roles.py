"""`python -m torchtitan.predict_rank_roles`: the trainer's start-up memory prediction, run by rank 0
as a child process (memory/startup.py): the checked job pickled on stdin, its prediction (or
why it failed) pickled on stdout. Changes that would fit are searched among the jobs the
pre-launch checks accept."""

from torchtitan.checks.job import accepts
from torchtitan.planning.startup import child_main

if __name__ == "__main__":
    child_main(accepts)
