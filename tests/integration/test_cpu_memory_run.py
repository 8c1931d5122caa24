"""--metrics.cpu_memory_peak on a real 2-rank CPU run: the peak in the console line,
metrics.jsonl and TensorBoard (rank 0), and every rank's own memory/rank<r>.jsonl.
The meter's arithmetic: tests/unit/test_cpu_memory.py."""

import json
import os

import run_tests


def _lines(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_peak_allocated_in_metrics_and_in_every_ranks_file(tmp_path):
    dump = str(tmp_path / "run")
    rc, _, out = run_tests.run(
        2,
        [
            "--training.steps=3",
            "--metrics.cpu_memory_peak=true",
            "--metrics.enable_tensorboard=true",
        ],
        dump,
    )
    assert rc == 0, out[-3000:]
    records = [r for r in _lines(os.path.join(dump, "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    peaks = {rank: _lines(os.path.join(dump, "memory", f"rank{rank}.jsonl")) for rank in (0, 1)}
    for rank, lines in peaks.items():
        assert [x["step"] for x in lines] == [1, 2, 3], (rank, lines)
        values = [x["peak_allocated_bytes"] for x in lines]
        assert all(isinstance(v, int) for v in values)
        # From step 2 on the step starts with gradients and AdamW state alive: a higher peak.
        assert 0 < values[0] < values[1] < 2**30, (rank, values)
    # metrics.jsonl is rank 0's, under CUDA's key
    assert [r["memory_peak_allocated_gib"] for r in records] == [
        x["peak_allocated_bytes"] / 2**30 for x in peaks[0]
    ]
    step_lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert (
        len(step_lines) == 3 and "  mem 0." in step_lines[-1] and "GiB  rss " in step_lines[-1]
    ), step_lines
    (events,) = [os.path.join(dump, "tb", n) for n in os.listdir(os.path.join(dump, "tb"))]
    with open(events, "rb") as f:
        assert b"memory_peak_allocated_gib" in f.read()
    # Neither kineto's per-window lines nor c10's allocator messages reach the ranks' output
    # (<dump>/ranks/<rank>/ with the fork-server launcher, deeper under torchrun).
    logs = [
        os.path.join(d, n)
        for d, _, names in os.walk(os.path.join(dump, "ranks"))
        for n in names
        if n in ("stdout.log", "stderr.log")
    ]
    assert len(logs) == 4, logs
    for path in logs:
        with open(path, errors="replace") as f:
            text = f.read()
        assert "USDT" not in text and "unknown size" not in text and "C10 alloc" not in text, (
            path,
            text[-2000:],
        )
