"""The layout search's probe of a model's block (compose.py's BlockProbe): the job's model
with 1 and with 2 blocks simulated like a dry run on 2 ranks (FSDP 2, one sequence per rank,
nothing else split), once per AC mode, on the job's hardware profile with the host timed
apart. Each simulation runs in a child process of its own (child.in_child)."""

from __future__ import annotations

import dataclasses

from torchtitan.distributed.job_shape import Degrees
from torchtitan.planning.search import compose
from torchtitan.planning.search import space as layout_space
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time.rank import RankTimer, _groups
from torchtitan.training.planned_job import PlannedJob

SHARDS = 2  # the probe's FSDP degree


class _BothTimer(RankTimer):
    """Times the probe's trace twice: the host apart from the kernels (the profile with
    host_async off: `compute` is device time, `overhead` host time) and as the GPU runs it
    (each run of ops costs max(device, host)): its busy time lands in the part "gpu_busy"."""

    def times(self, trace, dims, cfg, pipeline):
        # one rank alone on the machine (stretch 1): the composition applies the layout's own
        # sharing of a CPU's cores (rank._stretch), as the full model does
        apart = step_time.rank_times(
            trace.segments,
            dataclasses.replace(self.hardware, host_async=False),
            _groups(dims, trace),
            1.0,
            False,
        )
        gpu = step_time.rank_times(trace.segments, self.hardware, _groups(dims, trace), 1.0, False)
        order = None
        busy = sum(gpu.serial.parts.get(k, 0.0) for k in ("compute", "recompute", "overhead"))
        apart.serial.parts["gpu_busy"] = busy
        return apart, order


PROBE_EXPERTS = 8  # routed experts of the probe's block (at least top-k)
KEPT_SHARE = {"op": 23 / 50, "op2": 15 / 50}  # of AC none's kept activations (below)


def probe_args(args, blocks: int):
    """The probe's model: `blocks` blocks of the model's largest kind (MoE where it has them)
    with at most PROBE_EXPERTS routed experts: every expert's tokens are the same top-k
    copies, and a few experts keep the probe's states small, so its peak is at the start of
    its backward (the activations) and not in the optimizer (the experts' states); routing
    without group limits (the same work)."""
    extra = {"n_dense_layers": 0} if args.n_dense_layers else {}
    if args.moe is not None:
        experts = min(args.moe.n_routed_experts, max(args.moe.n_activated_experts, PROBE_EXPERTS))
        # the MoE fields every model names as DeepSeek-V3 does (models/protocol.MoeShape)
        extra.update(n_routed_experts=experts, n_expert_groups=1, n_limited_groups=1)
    return dataclasses.replace(args, n_layers=blocks, **extra)


def excess_seconds(device_s: float, host_s: float, busy_s: float, hw) -> float:
    """Running a block's ops as the device does (`busy_s`) over what its device and host time
    compose to: max(device, host) where the host queues kernels (a GPU), device + host where
    the thread that dispatches an op runs it (a CPU: its run is that sum and has no excess;
    max(...) there counted the host time twice, once as host and once as excess)."""
    bound = max(device_s, host_s) if hw.host_async else device_s + host_s
    return max(0.0, busy_s - bound)


def _simulate(job: PlannedJob, hw, ac: str, blocks: int, *, tp: int = 1, cp: int = 1) -> dict:
    """One probe simulation: the step time's parts and the peak's categories."""
    from torchtitan.distributed.job_shape import replica_groups
    from torchtitan.planning.memory import predict
    from torchtitan.planning.search.child import in_child
    from torchtitan.training.build import fake_world
    from torchtitan.training.planned_job import model_on_meta

    world = SHARDS * tp * cp
    lay = layout_space.Layout(Degrees(1, SHARDS, tp, 1, 1, world, cp), "", 1, ac, "auto", 1)
    # under fault tolerance every replica group reads its own rows of the global batch
    cfg = layout_space.apply(job.cfg, lay, SHARDS * replica_groups(job.cfg))
    args = probe_args(job.args, blocks)

    def run() -> dict:
        import torch.distributed as dist

        predict.RankTimer = _BothTimer  # this child process only
        if dist.is_initialized():  # forked from the dry run's own fake world: leave it here
            dist.destroy_process_group()
        with fake_world(cfg, world) as dims:
            probe_job = PlannedJob(cfg, model_on_meta(cfg, args), dims, job.target)
            (role,), _ = predict.predict_roles(probe_job, hardware=hw, worst_case=False)
        return {
            "time": dict(role.time.breakdown),
            "peak": role.predicted_peak_bytes,
            "memory": dict(role.breakdown),
        }

    return in_child(run)


def probe(
    job: PlannedJob, hw, ac_labels, model: compose.Model, *, tp: bool = True, cp: bool = True
) -> dict:
    """AC label -> compose.BlockProbe (at TP 1 CP 1, TP 2 and CP 2; tp / cp False: the
    layouts to compose split neither, their probe is skipped and reads as TP 1 / CP 1).
    `job` and `model` with float8 linears on or off alike (the float8 probe: its casts and
    what torchao saves measured, its GEMMs at the float8 peak)."""
    from torchtitan.planning.memory.model_states import model_shapes

    seq = job.cfg.training.seq_len
    # the probe's own block (its experts fewer): the analytic kernels subtracted from its
    # device time, and the unit its parameter-bound time is per
    small = probe_args(job.args, 1)
    block = model_shapes(job.cfg.model.name, small).blocks[0]
    moe = any(p.expert for p in block)
    tp2 = 2 if tp and model.n_heads and model.n_heads % 2 == 0 else 1
    cp2 = 2 if cp and model.n_heads and seq % 4 == 0 else 1

    def kernels_at(tokens: int) -> float:
        rows = tokens * model.top_k if moe else 0.0
        gemm = compose.gemm_seconds(block, tokens, hw, ep_rows=rows, float8=model.float8)
        return gemm + compose.attention_seconds(model, 1, tokens, hw)

    def kernels(t: int, c: int) -> float:
        tokens = seq // c
        rows = tokens * model.top_k if moe else 0.0
        gemm = compose.gemm_seconds(block, tokens, hw, tp=t, ep_rows=rows, float8=model.float8)
        return gemm + compose.attention_seconds(model, 1, seq, hw, tp=t, cp=c)

    rest_gemm = compose.gemm_seconds(model.last, seq, hw, float8=model.float8)
    unit = sum(p.numel for p in block)
    # the memory-bound time that follows the parameters, not the tokens (FSDP's copy-in and
    # copy-out around each gather and reduction, casts): the AC-none block at half the
    # sequence too; memory(T) = a + b T splits the two
    half = job.with_config(
        dataclasses.replace(
            job.cfg, training=dataclasses.replace(job.cfg.training, seq_len=seq // 2)
        )
    )
    done: dict = {}  # (AC, blocks, tp, cp) -> simulation, at the job's sequence

    def sim(ac: str, k: int, t: int = 1, c: int = 1) -> dict:
        if (ac, k, t, c) not in done:
            done[(ac, k, t, c)] = _simulate(job, hw, ac, k, tp=t, cp=c)
        return done[(ac, k, t, c)]

    h1, h2 = (_simulate(half, hw, "none", k) for k in (1, 2))
    f1, f2 = (sim("none", k) for k in (1, 2))
    per_half = h2["time"].get("compute", 0.0) - h1["time"].get("compute", 0.0)
    per_full = f2["time"].get("compute", 0.0) - f1["time"].get("compute", 0.0)
    mem_half = max(0.0, per_half - kernels_at(seq // 2))
    mem_full = max(0.0, per_full - kernels_at(seq))
    param_memory = max(0.0, min(mem_full, 2 * mem_half - mem_full))  # a = m(T) - 2 (m(T) - m(T/2))
    out = {}
    # layer SAC (every 2nd block) is half full, half none: the mean of their probes (its own
    # 2-block minus 1-block difference would be the unwrapped block alone)
    wanted = set(ac_labels)
    simulated = sorted(
        (wanted - {"layer2"}) | {"none"} | ({"full"} if "layer2" in wanted else set())
    )
    for ac in simulated:
        sims = {(t, c): [sim(ac, k, t, c) for k in (1, 2)] for t, c in {(1, 1), (tp2, 1), (1, cp2)}}
        one, two = sims[(1, 1)]

        def delta(part: str, where=(1, 1), sims=sims) -> float:
            a, b = sims[where]
            return b["time"].get(part, 0.0) - a["time"].get(part, 0.0)

        def mem(sim: dict, *cats: str) -> float:
            return sum(sim["memory"].get(c, 0) for c in cats)

        def excess(where) -> float:
            dev = delta("compute", where) + delta("recompute", where)
            return excess_seconds(dev, delta("overhead", where), delta("gpu_busy", where), hw)

        def memory(t: int, c: int) -> float:
            return max(0.0, delta("compute", (t, c)) - kernels(t, c))

        states = ("parameters", "optimizer_states", "gradients")
        # what one more block adds to the peak, less its states: the activations it keeps
        # (the peak is at the start of the backward, every block's saved tensors alive)
        # (less the units' own: a second unit gathered beside the first, its gradients)
        units = ("unsharded_parameters", "backward_transients")

        def kept_at(where, sims=sims, states=states, units=units) -> float:
            a, b = sims[where]
            return max(
                0.0,
                (b["peak"] - mem(b, *states) - mem(b, *units))
                - (a["peak"] - mem(a, *states) - mem(a, *units)),
            )

        states1 = mem(one, *states)
        kept_block = kept_at((1, 1))
        kept = kept_block / seq
        # the 1-block peak less states, that block's kept activations and the unit's own
        # transients (its gathered bf16 parameters and unsharded fp32 gradients), per token
        unit_bytes = (model.act_bytes + compose.REDUCE_BYTES) * unit
        transient = (one["peak"] - states1 - kept_block - unit_bytes) / seq
        dense = sum(p.numel for p in block if not p.expert and p.tp_dim is not None)
        at_tp2 = param_memory * (unit - dense + dense / tp2) / unit  # TP splits the dense
        out[ac] = compose.BlockProbe(
            tokens=seq,
            param_memory_s=param_memory,
            unit_elements=unit,
            memory_s=max(0.0, memory(1, 1) - param_memory),
            memory_tp2_s=max(0.0, memory(tp2, 1) - at_tp2),
            # per the probe's tokens, as the others (a CP rank holds 1 / cp2 of them)
            memory_cp2_s=max(0.0, memory(1, cp2) - param_memory) * cp2,
            recompute_s=delta("recompute"),
            host_s=delta("overhead"),
            host_tp_s=delta("overhead", (tp2, 1)),
            host_cp_s=delta("overhead", (1, cp2)),
            excess_s=excess((1, 1)),
            excess_tp_s=excess((tp2, 1)),
            excess_cp_s=excess((1, cp2)),
            rest_memory_s=max(0.0, one["time"].get("compute", 0.0) - delta("compute") - rest_gemm),
            rest_host_s=one["time"].get("overhead", 0.0) - delta("overhead"),
            tail_s=one["time"].get("optimizer", 0.0),
            tail_block_s=delta("optimizer"),
            kept_per_token=max(0.0, kept),
            # per the probe's tokens at TP 2 (a rank's share); per a CP rank's token at CP 2
            kept_tp2_per_token=kept_at((tp2, 1)) / seq,
            kept_cp2_per_token=kept_at((1, cp2)) / (seq // cp2),
            transient_per_token=max(0.0, transient),
        )
    # Only AC none's difference is its kept activations for sure: every block's saved tensors
    # are alive when its backward starts, and that is its peak. With AC a block's peak moves
    # (into its recompute, or to the end of the backward when its states are heavy), so an
    # AC mode keeps its share of AC none's (op SAC: every matmul's output, 23 / 50 of them on
    # Llama3 8B's full prediction; every 2nd matmul recomputed 15 / 50) or, under full AC, the
    # block's input alone
    if "none" in out:
        none = out["none"]
        for ac in out:
            if ac in KEPT_SHARE:
                k = KEPT_SHARE[ac]
                kept = (
                    k * none.kept_per_token,
                    k * none.kept_tp2_per_token,
                    k * none.kept_cp2_per_token,
                )
            elif ac == "full":  # the block's input, sequence-parallel under TP
                input_bytes = model.act_bytes * model.dim
                kept = (input_bytes, input_bytes / tp2, input_bytes)
            else:
                continue
            out[ac] = dataclasses.replace(
                out[ac],
                kept_per_token=kept[0],
                kept_tp2_per_token=kept[1],
                kept_cp2_per_token=kept[2],
            )
    if "layer2" in wanted:
        none, full = out["none"], out["full"]
        out["layer2"] = compose.BlockProbe(
            **{
                f.name: (getattr(none, f.name) + getattr(full, f.name)) / 2
                for f in dataclasses.fields(compose.BlockProbe)
            }
        )
    return {ac: out[ac] for ac in ac_labels}
