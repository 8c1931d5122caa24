"""Weight init draws each tensor in row blocks: every rank's shard is bitwise what one draw
of the whole tensor would give it (any placements, uneven splits), and a rank's peak memory
no longer grows by the whole tensor."""

import json
import os
import subprocess
import sys

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init_blocks_worker.py")


def _worker(subprocess_env, *args) -> dict:
    proc = subprocess.run([sys.executable, WORKER, *args], env=subprocess_env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_blocks_draw_what_the_whole_tensor_draw_gives_every_rank(subprocess_env):
    assert _worker(subprocess_env, "equality")["checked"] == 8 * 3 * 3


def test_peak_init_memory_per_rank_is_bounded_by_a_block(subprocess_env):
    whole = _worker(subprocess_env, "peak", str(1 << 40))  # the old way: one draw of 128256 x 256
    blocks = _worker(subprocess_env, "peak", str(1 << 22))  # 16 MiB blocks (the default)
    print(f"rank 3 of 8, 128256 x 256 fp32 embedding: peak growth {whole['peak_growth_mib']} MiB drawing it whole,"
          f" {blocks['peak_growth_mib']} MiB in blocks (shard {blocks['shard_mib']} MiB)")
    assert whole["peak_growth_mib"] > 110  # the whole 125 MiB tensor
    assert blocks["peak_growth_mib"] < 40  # one 16 MiB block and its picked rows
