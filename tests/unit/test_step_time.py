"""The step-time model's parts, without a process group: FLOP formulas, collective costs,
overlap of FSDP's gathers and reductions, the pipeline event simulation, profile choice."""

import dataclasses
from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F
from trace_helpers import trace_segments

from torchtitan import hardware
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import pipeline as pipeline_time
from torchtitan.planning.step_time.trace import (
    Comm,
    Compute,
    Segment,
    causal_kept,
    op_seconds,
)

H100 = hardware.PROFILES["h100_sxm"]


def _trace(fn, profile=H100, compiled=False) -> list[Segment]:
    return trace_segments(fn, profile, compiled)


def _flops(segments) -> float:
    return sum(e.flops for s in segments for e in s.events if isinstance(e, Compute))


def test_gemm_flops_match_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    a = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(48, 32, requires_grad=True)
    b = torch.randn(48, requires_grad=True)

    def step():
        y = F.linear(a, w, b)
        z = torch.bmm(y.view(4, 16, 48), y.view(4, 16, 48).transpose(1, 2))
        z.sum().backward()

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    assert _flops(_trace(step)) == counter.get_total_flops()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_flops_forward_and_backward(causal):
    b, h, s, d = 2, 4, 256, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    kept = causal_kept(s, s, H100.attention_block) if causal else 1.0
    assert kept == (0.75 if causal else 1.0)  # 2 x 2 blocks of 128: 3 computed
    forward = 2 * b * h * s * s * (d + d) * kept
    backward = 2 * b * h * s * s * (3 * d + 2 * d) * kept
    segs = _trace(step)
    attention = [e for s_ in segs for e in s_.events if isinstance(e, Compute)]
    assert _flops(segs) == forward + backward, attention


def test_grouped_gemm_flops_forward_and_backward():
    from torchtitan.models.common.grouped_mm import grouped_mm

    x = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(3, 16, 8, requires_grad=True)  # 3 experts, 8 -> 16
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    segs = _trace(lambda: grouped_mm(x, w, offs).sum().backward())
    assert _flops(segs) == 2 * 12 * 8 * 16 * 3  # forward, then grad_x and grad_w


def test_views_cost_nothing_and_recompute_is_marked():
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)

    def block(t):
        return torch.relu(t @ w)

    def step():
        torch.utils.checkpoint.checkpoint(
            block, x.view(64, 64).t(), use_reentrant=False
        ).sum().backward()

    segs = _trace(step)
    computes = [e for s in segs for e in s.events if isinstance(e, Compute)]
    assert sum(c.recompute_s for c in computes) > 0  # the matmul and relu again in backward
    plain = _trace(lambda: block(x.view(64, 64).t()).sum().backward())
    assert _flops(segs) == _flops(plain) + 2 * 64 * 64 * 64  # one recomputed matmul


def test_roofline_and_host_time():
    # a big bf16 GEMM is compute-bound at the GEMM efficiency
    flops = 2 * 8192**3
    device, host = op_seconds("gemm", flops, 3 * 8192 * 8192 * 2, "bfloat16", H100, compiled=False)
    eff = H100.gemm_efficiency * flops / (flops + H100.gemm_half_gflop * 1e9)
    assert device == pytest.approx(flops / (989.4e12 * eff))
    assert host == pytest.approx(10e-6)
    # an elementwise op moves bytes; compiled blocks move a fraction and launch fewer kernels
    device, host = op_seconds("memory", 0.0, 1e9, "bfloat16", H100, compiled=False)
    assert device == pytest.approx(1e9 / (3350e9 * 0.8))
    device_c, host_c = op_seconds("memory", 0.0, 1e9, "bfloat16", H100, compiled=True)
    assert (device_c, host_c) == pytest.approx((device * 0.5, host / 4))


def test_collective_costs_by_link():
    p = H100
    n8 = list(range(8))
    gb = 1 << 30
    assert step_time.collective_seconds("all_gather", gb, n8, p) == pytest.approx(
        7 / 8 * gb / 360e9 + 7 * 5e-6
    )
    # all-reduce: the ring's bandwidth, the tree's latency where it is shorter (2 x log2 8)
    assert step_time.collective_seconds("all_reduce", gb, n8, p) == pytest.approx(
        2 * 7 / 8 * gb / 360e9 + 2 * 3 * 5e-6
    )
    across = list(range(0, 64, 8))  # one rank per node: the NIC, NCCL's PAT (log2 8 steps)
    assert step_time.collective_seconds("reduce_scatter", gb, across, p) == pytest.approx(
        7 / 8 * gb / 42.5e9 + 3 * 15e-6
    )
    two_per_node = [0, 1, 8, 9, 16, 17, 24, 25]  # a ring: 7 steps, each as slow as the NIC hop
    assert step_time.collective_seconds("reduce_scatter", gb, two_per_node, p) == pytest.approx(
        7 / 8 * gb / 42.5e9 + 7 * 15e-6
    )
    assert step_time.collective_seconds("all_gather", gb, [3], p) == 0.0


def _groups(**dims):
    return step_time.Groups(
        {g: d for g, d in dims.items()},
        {g: list(range(8)) for g in dims},
        frozenset(g for g, d in dims.items() if d == "dp_shard"),
        frozenset(g for g, d in dims.items() if d == "dp_shard"),
    )


def test_fsdp_gathers_overlap_the_previous_units_compute_on_a_gpu():
    groups = _groups(fsdp="dp_shard", tp="tp")
    gather = step_time.collective_seconds("all_gather", 1 << 28, list(range(8)), H100)
    unit = Compute(device_s=2 * gather)  # each unit computes twice as long as its gather
    segs = [
        Segment(
            "forward",
            None,
            [
                Comm("all_gather", "fsdp", 1 << 28, "c10d"),
                unit,
                Comm("all_gather", "fsdp", 1 << 28, "c10d"),
                unit,
            ],
        )
    ]
    t = step_time.Streams(H100, groups, 1.0, simple_fsdp_eager=False).run(segs)
    assert t.seconds == pytest.approx(gather + 4 * gather)  # only the first gather is exposed
    assert t.parts["comm_dp_shard"] == pytest.approx(gather)
    # SimpleFSDP in eager gathers inside the forward: every gather is exposed
    t = step_time.Streams(H100, groups, 1.0, simple_fsdp_eager=True).run(segs)
    assert t.seconds == pytest.approx(2 * gather + 4 * gather)
    # TP's collectives sit on the critical path
    tp = [Segment("forward", None, [unit, Comm("all_reduce", "tp", 1 << 28, "functional"), unit])]
    t = step_time.Streams(H100, groups, 1.0, False).run(tp)
    assert t.parts["comm_tp"] == pytest.approx(
        step_time.collective_seconds("all_reduce", 1 << 28, list(range(8)), H100)
    )


def test_gradient_reductions_run_behind_backward_and_are_waited_for_at_its_end():
    groups = _groups(fsdp="dp_shard")
    rs = step_time.collective_seconds("reduce_scatter", 1 << 28, list(range(8)), H100)
    unit = Compute(device_s=rs / 2)
    segs = [
        Segment(
            "backward",
            None,
            [
                unit,
                Comm("reduce_scatter", "fsdp", 1 << 28, "c10d"),
                unit,
                Comm("reduce_scatter", "fsdp", 1 << 28, "c10d"),
            ],
        )
    ]
    t = step_time.Streams(H100, groups, 1.0, False).run(segs)
    # compute 0.5 | rs 0.5..1.5 | compute 0.5..1.0 | second rs 1.5..2.5, waited for at the end
    assert t.seconds == pytest.approx(2.5 * rs)
    assert t.parts["comm_dp_shard"] == pytest.approx(1.5 * rs)


def test_on_a_cpu_host_and_device_time_add_and_ranks_share_cores():
    local = dataclasses.replace(H100, host_async=False, cores=2)
    segs = [Segment("forward", None, [Compute(device_s=1.0, host_s=0.5)])]
    assert step_time.Streams(H100, _groups(), 1.0, False).run(segs).seconds == pytest.approx(
        1.0
    )  # max
    assert step_time.Streams(local, _groups(), 1.0, False).run(segs).seconds == pytest.approx(
        1.5
    )  # sum
    assert step_time.Streams(local, _groups(), 2.0, False).run(segs).seconds == pytest.approx(
        3.0
    )  # 4 ranks, 2 cores


def _timed(s):
    return step_time.Timed(s, {"compute": s})


def test_pipeline_event_simulation_of_1f1b_two_ranks():
    """Two stages, F = 1 s and B = 2 s each, 4 microbatches, 1F1B: the known closed form is
    (microbatches + stages - 1) x (F + B) = 15 s with free P2P."""
    order = {
        0: [
            (0, "F", 0),
            (0, "F", 1),
            (0, "B", 0),
            (0, "F", 2),
            (0, "B", 1),
            (0, "F", 3),
            (0, "B", 2),
            (0, "B", 3),
        ],
        1: [
            (1, "F", 0),
            (1, "B", 0),
            (1, "F", 1),
            (1, "B", 1),
            (1, "F", 2),
            (1, "B", 2),
            (1, "F", 3),
            (1, "B", 3),
        ],
    }
    times = {
        r: step_time.RankTimes(
            step_time.Timed(),
            {(r, "F", 0): _timed(1.0), (r, "B", 0): _timed(2.0)},
            step_time.Timed(),
        )
        for r in (0, 1)
    }
    end, busy = pipeline_time.pipeline_seconds(order, {0: 0, 1: 1}, times, 0.0, 2)
    assert end == pytest.approx(15.0)
    assert busy == {0: 12.0, 1: 12.0}
    end, _ = pipeline_time.pipeline_seconds(order, {0: 0, 1: 1}, times, 0.5, 2)
    # every backward of rank 0 waits for a forward transfer and a backward transfer (its F
    # and B alternate with rank 1's): 4 round trips of 2 x 0.5 s, less the one rank 0's
    # second warm-up forward hides
    assert end == pytest.approx(17.0)


def test_pipeline_order_comes_from_torchs_schedule():
    from torch.distributed.pipelining.schedules import Schedule1F1B

    class Stage:
        def __init__(self, i, n):
            self.stage_index, self.num_stages, self.group_size, self.group_rank = i, n, 2, i % 2
            self.submod = torch.nn.Identity()
            self.is_first, self.is_last = i == 0, i == n - 1

    one = Schedule1F1B(Stage(0, 2), n_microbatches=4)
    order, n = pipeline_time.schedule_order(one)
    assert n == 2 and order[1][:2] == [(1, "F", 0), (1, "B", 0)]
    assert sum(len(v) for v in order.values()) == 16
    times = {
        r: step_time.RankTimes(
            step_time.Timed(),
            {(r, "F", 0): _timed(1.0), (r, "B", 0): _timed(2.0)},
            step_time.Timed(),
        )
        for r in (0, 1)
    }
    assert pipeline_time.pipeline_seconds(order, {0: 0, 1: 1}, times, 0.0, n)[0] == pytest.approx(
        15.0
    )


def test_profile_choice_and_overrides():
    hw = NS(
        profile="auto",
        gpus_per_node="auto",
        peak_tflops="auto",
        hbm_gbps="auto",
        intra_node_gbps="auto",
        inter_node_gbps="auto",
        gemm_efficiency="auto",
    )
    assert hardware.resolve(hw, "cuda", gpu_names=["NVIDIA H200"]).name == "h200"
    assert hardware.resolve(hw, "cuda", gpu_names=["NVIDIA H100 PCIe"]).name == "h100_pcie"
    assert hardware.resolve(hw, "cuda", gpu_names=[]).name == "h100_sxm"  # none visible
    with pytest.raises(hardware.UnknownGPU):  # a GPU the table lacks: never h100_sxm
        hardware.resolve(hw, "cuda", gpu_names=["NVIDIA L20"])
    assert hardware.resolve(hw, "cpu", local=lambda: None) is None  # not measured: no prediction
    custom = hardware.resolve(
        NS(**{**vars(hw), "profile": "a100_80gb", "gpus_per_node": 4, "peak_tflops": 300.0}), "cuda"
    )
    assert (custom.name, custom.gpus_per_node, custom.peak_tflops["bfloat16"]) == (
        "a100_80gb",
        4,
        300.0,
    )
    assert hardware.gpu_profile_name("NVIDIA H100 80GB HBM3") == "h100_sxm"


def test_every_role_of_a_pipeline_job_gets_a_step_time():
    """The dry run's path in this process: a fake world of 4 ranks, tiny Llama3, PP 2 x FSDP 2,
    Interleaved1F1B, predicted on h100_sxm: one record per memory role, the same step time
    for both (the step is synchronous), a bubble on each, the breakdown summing to it."""
    from torchtitan.checks import load_config
    from torchtitan.planning.memory.predict import predict
    from torchtitan.training.build import fake_world
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    cfg, _ = load_config(
        [
            "--model.flavor=tiny",
            "--training.seq_len=64",
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--planning.memory_budget_gib=none",
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--parallelism.pipeline_parallel_layers_per_stage=1",
        ],
        4,
    )
    with fake_world(cfg, 4) as dims:
        roles = predict(PlannedJob(cfg, model_on_meta(cfg), dims, "cuda"), hardware=H100).roles
    times = [r.time for r in roles]
    assert [t.role for t in times] == ["pp0", "pp1"] and [t.ranks for t in times] == [
        r.ranks for r in roles
    ]
    assert times[0].predicted_step_seconds == times[1].predicted_step_seconds > 0
    tokens = 4 * 2 * 64  # local batch x dp x seq
    assert times[0].tokens_per_second_per_device == pytest.approx(
        tokens / times[0].predicted_step_seconds / 4
    )
    for t in times:
        assert t.breakdown["pipeline_bubble"] > 0 and "comm_dp_shard" in t.breakdown
        assert sum(t.breakdown.values()) == pytest.approx(t.predicted_step_seconds, rel=1e-9)
        assert set(t.record()) == {
            "role",
            "ranks",
            "predicted_step_seconds",
            "tokens_per_second_per_device",
            "mfu",
            "breakdown",
        }


def test_a_measured_cpu_profile_times_gloo_and_shared_cores_by_the_ranks_on_the_machine():
    from types import SimpleNamespace

    from torchtitan.planning.step_time.rank import _stretch

    cpu = dataclasses.replace(
        H100,
        host_async=False,
        cores=2,
        thread_speedup=1.8,
        sharing={"2": 1.1, "4": 2.2},
        intra_latency_us=0.0,
        gloo={
            "2": {"gbps": 1.0, "fixed_us": {"all_gather": 500.0}},
            "4": {"gbps": 0.5, "fixed_us": {"all_gather": 4000.0}},
        },
    )

    def world(n):
        return SimpleNamespace(world_size=n)

    assert _stretch(cpu, world(1)) == pytest.approx(1 / 1.8)  # one rank on both cores' threads
    assert _stretch(cpu, world(2)) == pytest.approx(1.1)
    assert _stretch(cpu, world(4)) == pytest.approx(2.2)
    assert _stretch(cpu, world(8)) == pytest.approx(4.4)  # beyond the measured count: time slices
    assert _stretch(H100, world(8)) == 1.0  # a GPU rank has its own device
    mb = 1 << 20
    assert step_time.collective_seconds("all_gather", mb, [0, 1], cpu, world=2) == pytest.approx(
        500e-6 + 0.5 * mb / 1e9
    )
    assert step_time.collective_seconds("all_gather", mb, [0, 1], cpu, world=4) == pytest.approx(
        4000e-6 + 0.5 * mb / 0.5e9
    )


def test_fsdp2_backward_prefetch_waits_for_the_gather_issued_a_unit_earlier():
    """Backward trace order of FSDP2: gather(next unit) in a unit's pre-backward, the unit's
    compute, its reduce-scatter. A unit waits for the gather issued one unit earlier, so with
    compute longer than gather + reduce-scatter only the first gather is exposed."""
    groups = _groups(fsdp="dp_shard")
    ag = step_time.collective_seconds("all_gather", 1 << 27, list(range(8)), H100)
    rs = step_time.collective_seconds("reduce_scatter", 1 << 28, list(range(8)), H100)
    unit = Compute(device_s=3 * (ag + rs))
    events = [Comm("all_gather", "fsdp", 1 << 27, "c10d")]  # the first unit's own gather
    for _ in range(4):
        events += [
            Comm("all_gather", "fsdp", 1 << 27, "c10d"),
            unit,
            Comm("reduce_scatter", "fsdp", 1 << 28, "c10d"),
        ]
    t = step_time.Streams(H100, groups, 1.0, False).run([Segment("backward", None, events)])
    assert t.parts["comm_dp_shard"] == pytest.approx(
        ag + rs
    )  # the first gather, the last reduce-scatter
    assert t.seconds == pytest.approx(ag + 4 * unit.device_s + rs)


def test_the_nearby_choices_of_a_job():
    from torchtitan.checks import load_config
    from torchtitan.planning.search.nearby import nearby_choices
    from torchtitan.training.planned_job import PlannedJob

    cfg, _ = load_config(
        [
            "--model.flavor=tiny",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
            "--parallelism.pipeline_parallel_degree=2",
            "--training.local_batch_size=4",
        ],
        4,
    )
    job = PlannedJob(cfg, None, NS(dp_shard=2, pp=2, dp=2), "cuda")  # no model: only choices
    changes = [c for c, _ in nearby_choices(job)]
    assert changes == [
        "--activation_checkpoint.mode=none",
        "--activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=2",
        "--parallelism.reshard_after_forward=never",
        "--parallelism.reshard_after_forward=always",
        "--training.local_batch_size=5",
        "--training.local_batch_size=3",
        "--compile.enable=true",
    ]
    candidates = dict(nearby_choices(job))
    assert candidates["--training.local_batch_size=5"].training.local_batch_size == 5
    assert (
        candidates["--compile.enable=true"].compile.enable and not cfg.compile.enable
    )  # the job is untouched
    # without FSDP or PP: only the AC neighbours and compile
    assert [
        c for c, _ in nearby_choices(PlannedJob(cfg, None, NS(dp_shard=1, pp=1, dp=1), "cuda"))
    ] == changes[:2] + changes[-1:]


@pytest.mark.parametrize(
    "arg,message",
    [
        (
            "--hardware.gpus_per_node=0",
            "--hardware.gpus_per_node=0: must be > 0 (or auto: the profile's value)",
        ),
        (
            "--hardware.clock_factor=1.5",
            "--hardware.clock_factor=1.5: must be > 0 and <= 1 (or auto: the profile's value)",
        ),
    ],
)
def test_bad_hardware_keys_are_one_line(arg, message):
    from torchtitan.checks import load_config
    from torchtitan.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config([arg], 1)
    assert str(info.value) == message


def test_gradient_accumulation_runs_each_pipeline_action_again_not_longer():
    """With accumulation the schedule runs once per accumulation step with the same
    (stage, kind, microbatch) actions: each run is one sample of the action's time (the step
    multiplies by the accumulation steps), not one action twice as long."""
    groups = step_time.Groups({}, {}, frozenset(), frozenset())

    def seg(label, action, seconds):
        return Segment(label, action, [Compute(device_s=seconds, host_s=0.0)])

    once = [
        seg("forward", (0, "F", 0), 1.0),
        seg("loss", (0, "F", 0), 0.5),
        seg("backward", (0, "B", 0), 2.0),
    ]
    twice = once + [
        seg("forward", (0, "F", 0), 1.0),
        seg("loss", (0, "F", 0), 0.5),
        seg("backward", (0, "B", 0), 2.0),
    ]
    for segments in (once, twice):
        t = step_time.rank_times(segments, H100, groups, 1.0, False)
        assert t.actions[(0, "F", 0)].seconds == pytest.approx(1.5)
        assert t.actions[(0, "B", 0)].seconds == pytest.approx(2.0)


def _float8_linear():
    from torch import nn

    from torchtitan.config.manager import build_config
    from torchtitan.models.common.float8 import convert_model

    cfg, _ = build_config(["--model.converters=quantize.linear.float8"])
    model = nn.Sequential(nn.Linear(256, 512, bias=False))
    convert_model(model, cfg.model.converters, cfg.quantize.linear.float8)
    return model


def test_float8_gemms_run_at_the_float8_peak_and_compiled_casts_fuse():
    """A float8 linear's GEMMs (torchao's mm on float8 tensors) are priced at the profile's
    float8 peak; in a compiled block each cast (simulate/patches.float8_casts_marked) is one
    fused kernel moving its amax read, its cast read and a float8 write, not its eager ops."""
    from torchtitan.planning.simulate.patches import float8_casts_marked

    model = _float8_linear()
    x = torch.randn(128, 256, requires_grad=True)

    def step():
        with float8_casts_marked():
            model(x).sum().backward()

    eager, compiled = _trace(step), _trace(step, compiled=True)
    assert _flops(eager) == _flops(compiled) == 3 * 2 * 128 * 256 * 512  # out, grad in, grad w

    def device_s(segs):
        return sum(e.device_s for s in segs for e in s.events if isinstance(e, Compute))

    # the GEMMs: each priced as op_seconds prices a float8 GEMM of its shape
    from torchtitan.planning.step_time import trace as trace_module

    priced = []
    original = trace_module.op_seconds

    def spy(kind, flops, nbytes, dtype, p, **kw):
        if kind == "gemm":
            priced.append(dtype)
        return original(kind, flops, nbytes, dtype, p, **kw)

    trace_module.op_seconds = spy
    try:
        _trace(step)
    finally:
        trace_module.op_seconds = original
    assert priced == ["float8"] * 3
    assert H100.peak_flops("float8") == pytest.approx(2 * H100.peak_flops("bfloat16"), rel=1e-4)
    # the casts fused: one kernel each, far fewer than their eager ops and their bytes
    ops = sum(e.ops for s in compiled for e in s.events if isinstance(e, Compute))
    eager_ops = sum(e.ops for s in eager for e in s.events if isinstance(e, Compute))
    assert ops < eager_ops / 3
    assert device_s(compiled) < device_s(eager)


def _ft_role(*ft: str):
    from torchtitan.checks import load_config
    from torchtitan.planning.memory.predict import predict
    from torchtitan.training.build import fake_world
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    argv = ["--model.flavor=tiny", "--training.seq_len=64", "--planning.memory_budget_gib=none"]
    argv.append("--job.dry_run=true")  # no lighthouse needed
    cfg, _ = load_config([*argv, *ft], 2)
    with fake_world(cfg, 2) as dims:
        (role,) = predict(PlannedJob(cfg, model_on_meta(cfg), dims, "cuda"), hardware=H100).roles
    return role


def test_replica_groups_all_reduce_is_priced_and_a_diloco_sync_shared_by_its_steps():
    """Fault tolerance: the groups' all-reduce on torchft's process group (one rank of each
    group, on the NIC) in the step time as comm_ft; every step's gradients synchronously, a
    DiLoCo sync's pseudo-gradients times 1 / sync_steps; tokens per device over every group's
    devices. DiLoCo's outer momentum (fp32, one per weight) in the memory peak; its copy of
    the global weights is host memory beside a GPU (not in the peak)."""
    alone = _ft_role()
    ft = ["--fault_tolerance.enable", "--fault_tolerance.group_size=4"]
    sync = _ft_role(*ft)
    every4 = _ft_role(
        *ft, "--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.sync_steps=4"
    )
    every8 = _ft_role(
        *ft, "--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.sync_steps=8"
    )
    assert "comm_ft" not in alone.time.breakdown
    assert sync.time.breakdown["comm_ft"] > 0
    # a sync's all-reduces (one per weight, latency and bytes) over 4 and 8 steps
    assert every4.time.breakdown["comm_ft"] == pytest.approx(2 * every8.time.breakdown["comm_ft"])
    # the same step: tokens over 4 groups' devices, each group's share of the global batch
    assert sync.time.tokens_per_second_per_device == pytest.approx(
        4 * 2 * 8 * 64 / sync.time.predicted_step_seconds / (2 * 4)
    )
    params = sum(p.numel() for p in model_on_meta_tiny().parameters()) * 4 // 2  # fp32, FSDP 2
    momentum = every4.breakdown["optimizer_states"] - sync.breakdown["optimizer_states"]
    assert momentum == pytest.approx(params, rel=0.02)


def model_on_meta_tiny():
    from torchtitan.checks import load_config
    from torchtitan.training.planned_job import model_on_meta

    cfg, _ = load_config(["--model.flavor=tiny"], 1)
    return model_on_meta(cfg).model
