"""Weight init draws each tensor in row blocks: every rank's shard is bitwise what one draw
of the whole tensor would give it (any placements, uneven splits), and a rank's peak memory
no longer grows by the whole tensor. Each measured in a fresh process of its own on a fake
8-rank world (init_blocks_worker.py): its peak memory is its own."""

import json
import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init_blocks_worker.py")
RUNS = {
    "equality": ["equality"],
    "whole": ["peak", str(1 << 40)],  # the old way: one draw of 128256 x 256
    "blocks": ["peak", str(1 << 22)],
}  # 16 MiB blocks (the default)


@pytest.fixture(scope="module")
def worker(subprocess_env):
    """The workers' results by RUNS name. All start at once, each in its own fresh process (its
    peak memory is its own): most of their time is importing torch, which they do side by side."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, WORKER, *args],
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in RUNS.items()
    }
    results = {}

    def result(name: str) -> dict:
        if name not in results:
            out, err = procs[name].communicate()
            assert procs[name].returncode == 0, err[-3000:]
            results[name] = json.loads(out.strip().splitlines()[-1])
        return results[name]

    yield result
    for proc in procs.values():
        proc.kill()
        proc.communicate()


def test_blocks_draw_what_the_whole_tensor_draw_gives_every_rank(worker):
    assert worker("equality")["checked"] == 8 * 3 * 3


def test_peak_init_memory_per_rank_is_bounded_by_a_block(worker):
    whole, blocks = worker("whole"), worker("blocks")
    print(
        f"rank 3 of 8, 128256 x 256 fp32 embedding: peak growth {whole['peak_growth_mib']} MiB drawing it whole,"
        f" {blocks['peak_growth_mib']} MiB in blocks (shard {blocks['shard_mib']} MiB)"
    )
    assert whole["peak_growth_mib"] > 110  # the whole 125 MiB tensor
    assert blocks["peak_growth_mib"] < 40  # one 16 MiB block and its picked rows
