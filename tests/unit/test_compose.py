"""The layout search's composition (planning/search/compose.py) on a made-up probe: its terms
move the way the layout says, and its shortcuts are exact where they claim to be."""

import dataclasses

import pytest

from torchtitan import hardware
from torchtitan.distributed.job_shape import Degrees
from torchtitan.models.shapes import Param
from torchtitan.planning.search import compose
from torchtitan.planning.search import space as layout_space

H100 = hardware.PROFILES["h100_sxm"]
DIM, HIDDEN, VOCAB, LAYERS = 1024, 4096, 32000, 8


def _block(i):
    p = f"layers.{i}."
    return [
        Param(p + "attention.wq.weight", (DIM, DIM), 0),
        Param(p + "attention.wk.weight", (DIM, DIM), 0),
        Param(p + "attention.wv.weight", (DIM, DIM), 0),
        Param(p + "attention.wo.weight", (DIM, DIM), 1),
        Param(p + "feed_forward.w1.weight", (HIDDEN, DIM), 0),
        Param(p + "feed_forward.w2.weight", (DIM, HIDDEN), 1),
        Param(p + "feed_forward.w3.weight", (HIDDEN, DIM), 0),
        Param(p + "attention_norm.weight", (DIM,)),
    ]


MODEL = compose.Model(
    DIM, VOCAB, LAYERS, 8, 128, 128, 2 * DIM, 1,
    [_block(i) for i in range(LAYERS)],
    [Param("tok_embeddings.weight", (VOCAB, DIM), 0)],
    [Param("norm.weight", (DIM,)), Param("output.weight", (VOCAB, DIM), 0)],
)  # fmt: skip
PROBE = compose.BlockProbe(
    tokens=4096, param_memory_s=1e-3, unit_elements=8 * DIM * DIM, memory_s=2e-3, memory_tp2_s=1.2e-3, memory_cp2_s=2.2e-3, recompute_s=0.0,
    host_s=1e-3, host_tp_s=4e-3, host_cp_s=1.5e-3, excess_s=0.0, excess_tp_s=1e-3,
    excess_cp_s=0.0, rest_memory_s=3e-3, rest_host_s=1e-3, tail_s=5e-3, tail_block_s=1e-3,
    kept_per_token=40 * DIM, kept_tp2_per_token=25 * DIM, kept_cp2_per_token=42 * DIM,
    transient_per_token=60 * DIM,
)  # fmt: skip
PROBES = {
    "none": PROBE,
    "full": dataclasses.replace(PROBE, recompute_s=4e-3, kept_per_token=2 * DIM),
}


def _lay(ac="none", local=2, schedule="", mb=1, **kw):
    d = dict(dp_replicate=1, dp_shard=16, tp=1, pp=1, ep=1, world_size=16, cp=1)
    d.update(kw)
    stages = d["pp"] * (2 if schedule == "Interleaved1F1B" else 1)
    splits = layout_space.split_points(LAYERS, stages) if d["pp"] > 1 else ()
    return layout_space.Layout(Degrees(**d), schedule, mb, ac, "auto", local, splits)


def _compose(lay, states=2**30, **kw):
    return compose.compose(
        lay, MODEL, PROBES, H100, seq=4096, global_batch=64, states_bytes=states,
        compiled=False, **kw,
    )  # fmt: skip


def test_recompute_costs_time_and_saves_activations():
    none, full = _compose(_lay("none")), _compose(_lay("full"))
    assert full.step_seconds > none.step_seconds and full.peak_bytes < none.peak_bytes
    assert full.parts["recompute"] == pytest.approx(4e-3 * 2 * 1 * LAYERS * 2)  # 2 seqs, accum 2


def test_each_split_brings_its_collectives_on_its_own_link():
    tp = _compose(_lay(dp_shard=8, tp=2))
    cp = _compose(_lay(dp_shard=8, cp=2))
    hsdp = _compose(_lay(dp_shard=8, dp_replicate=2))
    assert tp.parts["comm_tp"] > 0 and "comm_tp" not in _compose(_lay()).parts
    assert cp.parts["comm_cp"] > 0
    # HSDP across nodes: the replicas' all-reduce waits for the NIC its reduce-scatter holds
    assert hsdp.parts.get("comm_dp_replicate", 0) > 0


def test_a_larger_skew_slows_expert_parallel():
    moe = [Param("layers.0.moe.experts.w1", (8, HIDDEN, DIM), None, True)]
    model = dataclasses.replace(MODEL, blocks=[moe + _block(0)] * LAYERS, top_k=2)
    lay = _lay(dp_shard=16, ep=8)
    args = dict(seq=4096, global_batch=64, states_bytes=2**30, compiled=False)
    even = compose.compose(lay, model, PROBES, H100, **args)
    skewed = compose.compose(lay, model, PROBES, H100, skew=2.0, **args)
    assert skewed.step_seconds > even.step_seconds and even.parts["comm_ep"] > 0


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_many_microbatches_extrapolate_exactly_from_two_rounds(schedule, monkeypatch):
    """Past 4 x pp microbatches the pipeline is run at 2 and 3 rounds of pp and extrapolated:
    equal to running every microbatch (1F1B and Interleaved1F1B add the slowest stage's
    forward and backward per microbatch in their steady state)."""
    lay = _lay(local=16, schedule=schedule, pp=2, dp_shard=4, tp=2)  # 16 microbatches > 4 x 2
    short = _compose(lay)
    monkeypatch.setattr(compose, "_EXTRAPOLATE_FROM", 10**9)  # every microbatch run
    full = _compose(lay)
    assert short.step_seconds == pytest.approx(full.step_seconds, rel=1e-9)
    assert short.parts["compute"] == pytest.approx(full.parts["compute"], rel=1e-6)


def test_what_cp_adds_to_a_tokens_activations_is_split_over_tps_heads():
    """The CP probe's extra kept bytes per token (attention's: gathered K/V, masks) belong to
    the heads, which TP splits: at TP 8 they are an eighth (the 405B PP layouts' composed peaks
    were +45% over their full simulation when CP's addition stayed whole)."""
    seq, blocks = 4096, LAYERS
    peaks = {}
    for tp, cp in ((8, 1), (8, 2), (1, 1), (1, 2)):
        lay = _lay(dp_shard=32 // (tp * cp), tp=tp, cp=cp, world_size=32, local=1)
        peaks[tp, cp] = _compose(lay).peak_bytes
    # a CP rank holds seq / cp tokens: what CP 2 removes, then what its probe adds per token
    unsplit = 2 * PROBE.kept_tp2_per_token - PROBE.kept_per_token
    cp_add = PROBE.kept_cp2_per_token - PROBE.kept_per_token
    for tp in (1, 8):
        per_token = unsplit + (PROBE.kept_per_token - unsplit) / tp
        removed = per_token * (seq - seq // 2) * blocks
        added = cp_add / tp * (seq // 2) * blocks
        transient = PROBE.transient_per_token * (seq - seq // 2) / tp
        got = peaks[tp, 1] - peaks[tp, 2]
        assert got == pytest.approx(removed - added + transient, rel=0.05)


def test_a_cpu_blocks_host_time_is_not_counted_again_as_excess():
    """On a CPU the thread that dispatches an op runs it: a block's run is device + host, and
    nothing is left over. Before, the probe took max(device, host) there too, so the host time
    came back as 'excess' and the composition counted it twice (the 4-rank debug job's host
    time composed 2x the full model's)."""
    from torchtitan.planning.search.probe import excess_seconds

    cpu = dataclasses.replace(H100, host_async=False)
    assert excess_seconds(3.0, 1.0, 4.0, cpu) == 0.0
    assert excess_seconds(3.0, 1.0, 4.0, H100) == pytest.approx(1.0)  # a GPU: over max(3, 1)
    assert excess_seconds(1.0, 3.0, 3.5, H100) == pytest.approx(0.5)


def test_a_float32_job_moves_four_bytes_per_activation_and_gathered_parameter():
    """The composition took bf16 on the wire for every job; a CPU job computes in float32
    (training.mixed_precision_param auto), so its TP, CP, EP and P2P traffic and FSDP's
    gathers are twice as many bytes."""
    fp32 = dataclasses.replace(MODEL, act_bytes=4)
    lay = _lay(dp_shard=8, tp=2)
    args = dict(seq=4096, global_batch=64, states_bytes=2**30, compiled=False)
    bf16_parts = compose.compose(lay, MODEL, PROBES, H100, **args).parts
    fp32_parts = compose.compose(lay, fp32, PROBES, H100, **args).parts
    assert fp32_parts["comm_tp"] > 1.5 * bf16_parts["comm_tp"]
    from types import SimpleNamespace

    shapes = SimpleNamespace(blocks=MODEL.blocks, first=MODEL.first, last=MODEL.last)
    args = SimpleNamespace(dim=DIM, vocab_size=VOCAB, n_layers=LAYERS, attention=None, moe=None)
    assert compose.model_of(shapes, args, "float32").act_bytes == 4
    assert compose.model_of(shapes, args, "bfloat16").act_bytes == 2


def test_float8_linears_run_at_the_float8_peak_and_gather_one_byte_per_converted_element():
    """A layout with float8 linears (the layout search's float8 choice): each converted
    weight's three GEMMs at the profile's float8 peak (two with rowwise_with_gw_hp, whose
    weight gradient stays bf16), FSDP gathers the converted weights at 1 byte with the float8
    all-gather, and sequence parallel gathers the block inputs in float8 (forward only)."""
    block = _block(0)
    matrices = [p for p in block if len(p.shape) == 2]
    names = frozenset(compose.local_name(p.name) for p in matrices)
    assert "attention.wq.weight" in names  # any block's names
    f8 = compose.Float8(names, gather=True, tp=True, wgrad=True)
    tokens = 4096
    per = [2.0 * tokens * p.numel for p in matrices]
    want = {
        "bf16": sum(3 * compose._gemm_s(f, H100) for f in per),
        "f8": sum(3 * compose._gemm_s(f, H100, dtype="float8") for f in per),
        "gw_hp": sum(
            2 * compose._gemm_s(f, H100, dtype="float8") + compose._gemm_s(f, H100) for f in per
        ),
    }
    assert compose.gemm_seconds(block, tokens, H100) == pytest.approx(want["bf16"])
    assert compose.gemm_seconds(block, tokens, H100, float8=f8) == pytest.approx(want["f8"])
    gw_hp = dataclasses.replace(f8, wgrad=False)
    assert compose.gemm_seconds(block, tokens, H100, float8=gw_hp) == pytest.approx(want["gw_hp"])
    assert want["f8"] < want["gw_hp"] < want["bf16"]

    lay = _lay(dp_shard=8, tp=2)
    args = dict(seq=4096, hw=H100, compiled=False, skew=1.0)
    plain = compose._block_costs(MODEL, block, PROBE, lay, **args)
    f8_costs = compose._block_costs(
        dataclasses.replace(MODEL, float8=f8), block, PROBE, lay, **args
    )
    split = sum(p.numel // 2 for p in matrices)  # TP 2 splits every matrix
    assert compose._bytes(plain.gather, "all_gather") == 2 * (split + DIM)  # bf16, the norm whole
    assert compose._bytes(f8_costs.gather, "all_gather") == split + 2 * DIM
    # the reductions stay fp32; TP's forward gathers halve, its backward ones do not
    assert compose._bytes(f8_costs.reduce) == compose._bytes(plain.reduce)
    assert compose._bytes(f8_costs.crit_fwd, "all_gather") * 2 == compose._bytes(
        plain.crit_fwd, "all_gather"
    )
    assert compose._bytes(f8_costs.crit_bwd) == compose._bytes(plain.crit_bwd)
    no_gather = dataclasses.replace(f8, gather=False)
    off = compose._block_costs(
        dataclasses.replace(MODEL, float8=no_gather), block, PROBE, lay, **args
    )
    assert compose._bytes(off.gather, "all_gather") == compose._bytes(plain.gather, "all_gather")
