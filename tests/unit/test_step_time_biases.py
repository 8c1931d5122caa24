"""The step-time model's known biases (issue 47), one test each: every test here failed on
the model before the fix it names, and states the prediction it moved."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from torchtitan import hardware
from torchtitan.distributed.context_parallel import causal_chunk_mask
from torchtitan.planning.simulate.tracker import LiveBytes
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import pipeline as pipeline_time
from torchtitan.planning.step_time.trace import Comm, Compute, OpTrace, Segment

H100 = hardware.PROFILES["h100_sxm"]
CPU_LIKE = dataclasses.replace(H100, host_async=False)  # a CPU kernel: every masked block runs
NO_GROUPS = step_time.Groups({}, {}, frozenset(), frozenset())


def _seg(label, action, *events):
    return Segment(label, action, list(events))


def _shape(accum=1):
    return step_time.StepShape(1000, 2, 1.0, 0.0, accum)


def _step(segments_by_rank, order, accum=1, groups=NO_GROUPS):
    times = {
        r: step_time.rank_times(segs, H100, groups, 1.0, False)
        for r, segs in segments_by_rank.items()
    }
    roles = [(f"pp{r}", [r], r) for r in times]
    return step_time.role_times(roles, times, order, _shape(accum))


def _fsdp_groups(*dims):
    """Group name = mesh dim; dp_shard FSDP's; every group over 8 ranks, one per node."""
    return step_time.Groups(
        {d: d for d in dims},
        {d: list(range(0, 64, 8)) for d in dims},
        frozenset({"dp_shard"}) & set(dims),
        frozenset(d for d in dims if d.startswith("dp")),
    )


# 1 ----------------------------------------------------------------------------------------


def test_a_pipelines_gradient_reduction_after_its_last_backward_reaches_the_step():
    """PP + FSDP: torch 2.13 reduce-scatters a stage's gradients once, after its last
    backward (traced as the action (stage, "R", None)); the schedule orders never held it.
    Before: 15.0 s (the reduction free); after: 15.0 + its 0.5 s on the last rank to end."""
    groups = _fsdp_groups("dp_shard")
    rs_bytes = 1 << 28
    rs = step_time.collective_seconds("reduce_scatter", rs_bytes, groups.ranks["dp_shard"], H100)

    def rank(r):
        return [
            _seg("forward", (r, "F", 0), Compute(device_s=1.0)),
            _seg("backward", (r, "B", 0), Compute(device_s=2.0)),
            _seg(
                "backward (gradient reduction)",
                (r, "R", None),
                Comm("reduce_scatter", "dp_shard", rs_bytes, "c10d"),
            ),
        ]

    order = pipeline_time.order_for("1F1B", 2, 4)
    got = _step({0: rank(0), 1: rank(1)}, order, groups=groups)
    assert got[0].predicted_step_seconds == pytest.approx(15.0 + rs)  # rank 0 ends last
    assert got[0].breakdown["comm_dp_shard"] == pytest.approx(rs)


# 2 ----------------------------------------------------------------------------------------


def test_the_first_microbatchs_parameter_gather_is_counted_once_however_many_are_timed():
    """The layout search simulates 2 microbatches and times 8: only the first forward gathers
    the stage's parameters (reshard never), so timing 8 through the 2 simulated must equal
    simulating all 8. Before, each action kind took the mean of its runs: every forward
    took 2 s, the gather of microbatch 0 counted in all 8 (step 36.0 s vs 31.0 s)."""

    def rank(r, microbatches):
        out = []
        for mb in range(microbatches):
            gather = [Compute(device_s=2.0)] if mb == 0 else []  # exposed gather, as time
            out.append(_seg("forward", (r, "F", mb), *gather, Compute(device_s=1.0)))
            out.append(_seg("backward", (r, "B", mb), Compute(device_s=2.0)))
        return out

    order = pipeline_time.order_for("1F1B", 2, 8)
    timed = _step({0: rank(0, 2), 1: rank(1, 2)}, order)
    direct = _step({0: rank(0, 8), 1: rank(1, 8)}, order)
    assert timed[0].predicted_step_seconds == pytest.approx(direct[0].predicted_step_seconds)
    # 1F1B's (microbatches + stages - 1) x (F + B), plus each rank's first-forward gather
    assert direct[0].predicted_step_seconds == pytest.approx((8 + 1) * 3.0 + 2 * 2.0)


# 3 ----------------------------------------------------------------------------------------


def _attention_flops(profile, q_len, chunks):
    """FLOPs traced for SDPA of `chunks` (key count, mask) of q_len queries each."""
    trace = OpTrace(profile, False)
    tracker = LiveBytes(lambda *a: "activations")
    tracker.observer = trace
    tracker.phase = "forward"
    d = 16
    with tracker, trace.recording():
        for end, mask in chunks:
            q = torch.randn(1, 2, q_len, d)
            k, v = torch.randn(1, 2, end, d), torch.randn(1, 2, end, d)
            if mask is None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return sum(e.flops for s in trace.segments for e in s.events if isinstance(e, Compute))


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_chunks_count_the_blocks_a_gpu_kernel_runs(cp):
    """CP's head-tail chunks attend with explicit lower-right causal masks on the CPU path
    the simulation runs; a GPU's kernels skip the masked blocks. Before: +25% (CP 2) and
    +12.5% (CP 4) over the causal half of the whole sequence's attention; after: the FLOPs
    of the whole sequence's causal kernel on a GPU profile, and still every block on a CPU
    one."""
    seq, block = 2048, H100.attention_block
    n = seq // (2 * cp)  # a chunk
    whole = _attention_flops(H100, seq, [(seq, None)])
    ranks = [(r, 2 * cp - 1 - r) for r in range(cp)]
    gpu = sum(
        _attention_flops(H100, n, [((c + 1) * n, causal_chunk_mask(n, (c + 1) * n, "cpu"))])
        for chunks in ranks
        for c in chunks
    )
    cpu = sum(
        _attention_flops(CPU_LIKE, n, [((c + 1) * n, causal_chunk_mask(n, (c + 1) * n, "cpu"))])
        for chunks in ranks
        for c in chunks
    )
    every = _attention_flops(CPU_LIKE, seq, [(seq, torch.ones(seq, seq, dtype=torch.bool))])
    assert n % block == 0
    assert gpu == pytest.approx(whole)
    # the CPU kernel: every block of every chunk, (2cp + 1) / 2cp of the causal half
    assert cpu == pytest.approx(every / 2 * (2 * cp + 1) / (2 * cp))


# 4 ----------------------------------------------------------------------------------------


def test_mesh_dims_that_cross_nodes_share_one_nic():
    """HSDP with both dims across nodes: the dp_shard reduce-scatter and the dp_replicate
    all-reduce of one backward share the rank's NIC (before: each dim had a link of its own
    and they overlapped: max instead of sum). A dim inside a node keeps NVLink apart."""
    groups = _fsdp_groups("dp_shard", "dp_replicate")
    nbytes = 1 << 28
    rs = step_time.collective_seconds("reduce_scatter", nbytes, groups.ranks["dp_shard"], H100)
    ar = step_time.collective_seconds("all_reduce", nbytes, groups.ranks["dp_replicate"], H100)
    segs = [
        _seg(
            "backward",
            None,
            Comm("reduce_scatter", "dp_shard", nbytes, "c10d"),
            Comm("all_reduce", "dp_replicate", nbytes, "c10d"),
        )
    ]
    t = step_time.Streams(H100, groups, 1.0, False).run(segs)
    assert t.seconds == pytest.approx(rs + ar)
    inside = dataclasses.replace(groups, ranks={**groups.ranks, "dp_shard": list(range(8))})
    rs_in = step_time.collective_seconds("reduce_scatter", nbytes, list(range(8)), H100)
    t = step_time.Streams(H100, inside, 1.0, False).run(segs)
    assert t.seconds == pytest.approx(max(rs_in, ar))


# 5 ----------------------------------------------------------------------------------------


def test_an_all_to_all_is_timed_by_the_busier_side():
    """The busiest EP rank (planning.memory_skew = 2: it receives twice what it sends) waits
    for what it receives. Before: the bytes it sends (1 MiB); after: what it receives (2)."""
    trace = OpTrace(H100, False)
    trace.active = True
    func = torch.ops._c10d_functional.all_to_all_single.default
    sent = torch.empty(1 << 18, dtype=torch.float32)  # 1 MiB
    received = torch.empty(1 << 19, dtype=torch.float32)  # 2 MiB
    trace.seen(func, (sent, [1 << 19], [1 << 18], "ep"), {}, received, label="forward", action=None)
    (comm,) = [e for s in trace.segments for e in s.events if isinstance(e, Comm)]
    assert (comm.kind, comm.nbytes) == ("all_to_all", 2 << 20)


# 6 ----------------------------------------------------------------------------------------


def test_a_scalar_all_reduce_over_2048_ranks_costs_a_tree_not_a_ring():
    """Before: 2 x 2,047 ring steps of 15 us = 61 ms for 4 bytes; after: NCCL's tree, 2 x 11
    levels = 0.33 ms. A large all-reduce keeps the ring's bandwidth term."""
    ranks = list(range(2048))
    scalar = step_time.collective_seconds("all_reduce", 4, ranks, H100)
    assert scalar == pytest.approx(2 * 11 * 15e-6, rel=1e-3)
    gb = 1 << 30
    big = step_time.collective_seconds("all_reduce", gb, ranks, H100)
    assert big == pytest.approx(2 * 2047 / 2048 * gb / (H100.inter_node_gbps * 1e9), rel=1e-2)


# 8 ----------------------------------------------------------------------------------------


def test_an_action_the_simulation_did_not_run_fails_instead_of_costing_nothing():
    """Before: pipeline_seconds timed a (stage, kind) it had no time for as 0.0 s."""
    times = {
        0: step_time.RankTimes(
            step_time.Timed(), {(0, "F", 0): step_time.Timed(1.0)}, step_time.Timed()
        )
    }
    with pytest.raises(KeyError, match="ran no B action of stage 0"):
        pipeline_time.pipeline_seconds({0: [(0, "F", 0), (0, "B", 0)]}, {0: 0}, times, 0.0, 1)


def test_the_first_stages_input_backward_is_nothing_when_its_weight_action_ran():
    """ZBV's first stage has no input to differentiate: torch runs its whole backward in the
    weight action, so the simulation has W but no I for it (a training run with the local
    profile failed at start-up on this). Any other missing I still fails."""
    w = step_time.Timed(2.0)
    first = step_time.RankTimes(
        step_time.Timed(),
        {(0, "F", 0): step_time.Timed(1.0), (0, "W", 0): w},
        step_time.Timed(),
    )
    assert first.action(0, "I", 0).seconds == 0.0
    assert first.action(0, "W", 0) is w
    order = {0: [(0, "F", 0), (0, "I", 0), (0, "W", 0)]}
    assert pipeline_time.pipeline_seconds(order, {0: 0}, {0: first}, 0.0, 1)[0] == pytest.approx(
        3.0
    )
    with pytest.raises(KeyError, match="ran no I action of stage 1"):
        first.action(1, "I", 0)
    later = step_time.RankTimes(
        step_time.Timed(),
        {(1, "F", 0): step_time.Timed(1.0), (1, "B", 0): step_time.Timed(3.0)},
        step_time.Timed(),
    )
    assert later.action(1, "I", 0).seconds == 3.0  # an I simulated as a full backward
