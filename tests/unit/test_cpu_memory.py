"""The CPU peak-allocated meter (observe/cpu_memory.py) on workloads of known sizes, its
census, its per-rank file and the config's refusal to run it beside the profiler. The real
2-rank run: tests/integration/test_cpu_memory_run.py."""

import json

import pytest
import torch
from config_helpers import config_error
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from torchtitan.observe.cpu_memory import CpuPeakMeter, _allocator_flag, live_tensor_bytes
from torchtitan.observe.metrics import StepMemoryLog

KB = 1000


def _bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def test_peak_of_a_known_workload_is_exact():
    kept = _bytes(10 * KB)  # alive before the meter starts: the census counts it
    with CpuPeakMeter() as meter:
        meter.begin_step()
        a, b = _bytes(40 * KB), _bytes(30 * KB)  # 70 KB: the peak
        del a
        c = _bytes(20 * KB)  # 50 KB
        del b
        peak = meter.end_step()
        start = meter.step_start_bytes
        assert start == meter.census_bytes and peak - start == 70 * KB

        meter.begin_step()  # c (20 KB) lives on into step 2
        d = _bytes(5 * KB)
        del c, d
        views = _bytes(8 * KB)
        views_too = [views[1:], views.view(2, -1), views[::2]]  # views allocate nothing
        peak = meter.end_step()
        assert meter.step_start_bytes - start == 20 * KB and peak - start == 25 * KB

        del views, views_too  # freed between steps: the next step starts without them
        meter.begin_step()
        peak = meter.end_step()
        assert meter.step_start_bytes == start == peak
        assert meter.step_start_bytes == live_tensor_bytes()
    del kept


def test_a_free_on_another_thread_counts():
    """gloo's worker threads free collective buffers the main thread allocated; the profiler
    does not hear of these frees, the allocator's own counter (the flag the meter sets) does."""
    import threading

    with CpuPeakMeter() as meter:
        meter.begin_step()
        box = [_bytes(64 * KB)]
        meter.end_step()
        start = meter.step_start_bytes
        meter.begin_step()
        worker = threading.Thread(target=box.clear)  # the last reference dies on the worker
        worker.start()
        worker.join()
        meter.end_step()
        assert meter.step_start_bytes == start + 64 * KB
        meter.begin_step()
        assert meter.end_step() == start and meter.step_start_bytes == start


def test_census_counts_each_storage_once_views_and_dtensor_shards(gloo_world):
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    before = live_tensor_bytes()
    base = torch.zeros(1000)  # 4000 bytes
    views = [base[10:], base.view(10, 100), base[::3]]
    local = torch.zeros(250)  # 1000 bytes
    shard = DTensor.from_local(local, mesh, [Shard(0)])  # its local tensor is `local`: counted once
    param = torch.nn.Parameter(torch.zeros(50))  # 200 bytes
    assert live_tensor_bytes() - before == 4000 + 1000 + 200
    assert shard.to_local().untyped_storage().data_ptr() == local.untyped_storage().data_ptr()
    del views, shard, local, param, base


def test_the_meter_leaves_the_allocator_flag_as_it_found_it():
    flag = _allocator_flag()
    assert flag is not None  # torch 2.13's libc10 exports it: without it peaks creep up
    before = flag.value
    with CpuPeakMeter() as meter:
        assert flag.value is True
        meter.begin_step()
        meter.end_step()
    assert flag.value is before


def test_every_rank_writes_its_own_peaks_and_a_resume_drops_later_steps(tmp_path):
    cpu = torch.device("cpu")
    with StepMemoryLog(cpu, True, str(tmp_path), rank=3) as memory:
        for step in (1, 2, 3):
            memory.begin()
            x = _bytes(16 * KB)
            values = memory.end(step)
            del x
    assert set(values) == {"memory_peak_allocated_gib", "memory_rss_gib"}
    path = tmp_path / "memory" / "rank3.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(
        isinstance(r["peak_allocated_bytes"], int) and r["peak_allocated_bytes"] >= 16 * KB
        for r in records
    )
    assert values["memory_peak_allocated_gib"] == records[-1]["peak_allocated_bytes"] / 2**30

    with StepMemoryLog(cpu, True, str(tmp_path), rank=3) as memory:  # resumed after step 2
        memory.begin()
        memory.end(3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert [json.loads(line) for line in path.read_text().splitlines()][:2] == records[:2]


def test_a_fresh_run_replaces_an_earlier_runs_file(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "rank0.jsonl").write_text('{"step": 1, "peak_allocated_bytes": 5}\n' * 3)
    with StepMemoryLog(torch.device("cpu"), True, str(tmp_path), rank=0) as memory:
        memory.begin()
        _bytes(6 * KB)  # allocated and freed at once
        memory.end(1)
    lines = (tmp_path / "memory" / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["peak_allocated_bytes"] >= 6 * KB


def test_without_the_key_cpu_writes_no_peak(tmp_path):
    with StepMemoryLog(torch.device("cpu"), False, str(tmp_path), rank=0) as memory:
        memory.begin()
        assert list(memory.end(1)) == ["memory_rss_gib"]
    assert not (tmp_path / "memory").exists()


def test_refused_with_the_profiler():
    msg = config_error(["--metrics.cpu_memory_peak=true", "--profiling.enable_profiling=true"])
    assert msg == (
        "--metrics.cpu_memory_peak=true and --profiling.enable_profiling=true cannot run together"
        " (only one torch profiler runs in a process): set one of them to false"
    )


def test_the_meter_will_not_start_beside_another_profiler():
    # torch.autograd's profiler, not torch.profiler.profile: that one also sets
    # TORCHINDUCTOR_CACHE_DIR in os.environ, which sends later test runs to torchrun.
    with torch.autograd.profiler.profile(use_kineto=True):
        meter = CpuPeakMeter()
        with pytest.raises(RuntimeError, match="another torch profiler is running"):
            meter.begin_step()
        meter.close()


def test_on_cuda_every_rank_writes_max_memory_allocated(tmp_path, monkeypatch):
    """The CUDA path, without a GPU: the peak is the caching allocator's, the key changes nothing."""
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 4 * 2**30)
    for cpu_peak in (False, True):
        with StepMemoryLog(torch.device("cuda", 0), cpu_peak, str(tmp_path), rank=1) as memory:
            assert memory.meter is None
            memory.begin()
            assert memory.end(1) == {
                "memory_peak_allocated_gib": 3.0,
                "memory_peak_reserved_gib": 4.0,
            }
        assert calls == ["reset"] * (1 + cpu_peak)
        lines = (tmp_path / "memory" / "rank1.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == [
            {"step": 1, "peak_allocated_bytes": 3 * 2**30}
        ]


def test_not_refused_on_cuda_where_the_key_changes_nothing():
    from torchtitan.checks import load_config

    cfg, _ = load_config(
        [
            "--training.device=cuda",
            "--metrics.cpu_memory_peak=true",
            "--profiling.enable_profiling=true",
        ],
        1,
    )
    assert cfg.metrics.cpu_memory_peak and cfg.profiling.enable_profiling
