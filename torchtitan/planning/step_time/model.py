"""The step-time model: one simulated step's trace (op_trace.py) and a hardware profile
(hardware.py) -> the time of a training step per rank role, with its breakdown.

Everything this model assumes is here, to be checked line by line:

1. Compute. Each op's device time is a roofline on the profile (op_trace.op_seconds); a GPU
   queues kernels, so a run of ops costs max(device time, host dispatch time); a CPU runs
   them on the dispatching thread: device + host. A CPU node's C cores are shared by its N
   ranks (cpu_sharing.py) (run_train.sh gives each max(1, C / N) threads; the profile is measured on one):
   device time scales by N / C, host time (one thread) by max(1, N / C).
2. Collectives (`collective_seconds`): ring algorithms on the slowest link the group
   crosses: inside a node `intra_node_gbps`, across nodes `inter_node_gbps` (per rank,
   rail-optimised NICs): all-gather / reduce-scatter (n-1)/n x bytes / bandwidth, all-reduce
   twice that, all-to-all (n-1)/n x bytes, plus the latency of the algorithm NCCL picks
   (ring steps; all-reduce's tree where that is faster; PAT with one rank per node).
   Collectives on one physical link run one at a time: every group that crosses nodes
   shares the rank's NIC (FSDP, HSDP's replicas, EP, CP, PP alike), every group inside a
   node its NVLink; the two links run side by side.
3. Overlap (`Streams`), on a GPU: in forward, FSDP's parameter all-gather of a unit is
   issued when the unit before it starts computing (FSDP2's implicit prefetch: the host runs
   ahead), so only what exceeds that unit's compute is exposed; in backward FSDP2 issues the
   next unit's gather in a unit's pre-backward (explicit prefetch), so a unit waits for the
   gather issued a unit earlier;
   gradient reduce-scatters / all-reduces in backward run behind the compute and are waited
   for at the end of the backward; every other collective (TP, EP's all-to-all, CP, the
   loss and gradient-norm all-reduces, SimpleFSDP's gathers in eager mode) sits on the
   critical path. On a CPU (gloo, the host is the device) every collective is waited for
   where it is issued.
4. Pipeline (pipeline.py's `pipeline_seconds`): an event simulation over the real schedule's per-rank
   action order (`schedule.pipeline_order`): an action starts when its rank is free and its
   input has arrived (the previous stage's forward / the next stage's backward of the same
   microbatch, plus the P2P transfer of the stage boundary over the pipeline link); each
   action lasts what its simulated ops take (the same stage's microbatches alike). The step
   ends when the last rank has finished, then the step tail (training/phases.py's TAIL: tied
   copies, clipping, the non-finite record, the optimizer, the expert balance) runs on every rank.
   The bubble of a rank is the step time minus its busy time. On a CPU the ranks share the
   cores: an action runs faster while fewer ranks compute (cpu_sharing.py's `busy_rates`: a rank waiting for
   its neighbour leaves its core to the others), and the simulation shares them among the
   actions running at each moment.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from torchtitan.hardware import HardwareProfile
from torchtitan.planning.step_time.cpu_sharing import sync_skew
from torchtitan.planning.step_time.pipeline import pipeline_seconds
from torchtitan.planning.step_time.trace import Comm, Compute, Segment
from torchtitan.training.phases import BACKWARD, TAIL, StepPhase, phase_of

PIPELINE_LABELS = (StepPhase.PIPELINE,)
TAIL_LABELS = TAIL  # after the pipeline's last action, on every rank
BREAKDOWN = ("compute", "recompute", "overhead", "optimizer", "pipeline_bubble")  # + "comm_<dim>"


@dataclass
class Link:
    name: str  # the physical link: "nvlink" (inside a node) or "nic" (across nodes)
    gbps: float
    latency_us: float


def link_of(ranks: list[int], p: HardwareProfile) -> Link:
    """The slowest link a group of global ranks crosses (nodes of gpus_per_node ranks)."""
    if _nodes(ranks, p) <= 1:
        return Link("nvlink", p.intra_node_gbps, p.intra_latency_us)
    return Link("nic", p.inter_node_gbps, p.inter_latency_us)


def _nodes(ranks: list[int], p: HardwareProfile) -> int:
    return len({r // max(p.gpus_per_node, 1) for r in ranks})


def ring_latency_s(ranks: list[int], p: HardwareProfile) -> float:
    """The latency of an all-gather or reduce-scatter: n - 1 ring steps, each as slow as the
    slowest hop (NCCL's ring); with one rank per node NCCL runs them as PAT, a tree of
    log2 n steps (NCCL 2.23+; it takes PAT for one GPU per node only)."""
    n, nodes = len(ranks), _nodes(ranks, p)
    if nodes == n and n > 2:
        return tree_latency_s(ranks, p)
    return (n - 1) * link_of(ranks, p).latency_us * 1e-6


def tree_latency_s(ranks: list[int], p: HardwareProfile) -> float:
    """The latency of a (binary) tree over `ranks`: log2(n) levels, each on the slowest link
    the group crosses (NCCL's tree all-reduce; broadcast)."""
    return math.ceil(math.log2(max(len(ranks), 2))) * link_of(ranks, p).latency_us * 1e-6


def collective_seconds(
    kind: str, nbytes: int, ranks: list[int], p: HardwareProfile, world: int = 0
) -> float:
    """`world`: the ranks on one machine, for a measured CPU profile (gloo's cost depends on
    how many processes share the cores: `gloo` table of 2 or 4, the nearest).

    Latency: all-gather and reduce-scatter pass once round a ring (`ring_latency_s`);
    all-reduce is a reduce-scatter and an all-gather, or, when that is faster (small
    messages on many ranks: a scalar over 2,048 ranks), NCCL's tree: reduce up and broadcast
    down (2 x log2 n levels; the bandwidth term the ring's); all-to-all one latency per peer;
    broadcast a tree."""
    n = len(ranks)
    if n <= 1 and kind not in ("send", "recv"):
        return 0.0
    link = link_of(ranks, p)
    bw = link.gbps * 1e9
    fixed = p.collective_us.get(kind, 0.0) * 1e-6
    if p.gloo:
        table = p.gloo["4" if world > 2 and "4" in p.gloo else "2"]
        bw, fixed = table["gbps"] * 1e9, table["fixed_us"].get(kind, 0.0) * 1e-6
    if kind in ("all_gather", "reduce_scatter"):
        return fixed + (n - 1) / n * nbytes / bw + ring_latency_s(ranks, p)
    if kind == "all_to_all":
        return fixed + (n - 1) / n * nbytes / bw + (n - 1) * link.latency_us * 1e-6
    if kind == "all_reduce":
        latency = min(2 * ring_latency_s(ranks, p), 2 * tree_latency_s(ranks, p))
        return fixed + 2 * (n - 1) / n * nbytes / bw + latency
    if kind == "broadcast":
        return fixed + nbytes / bw + tree_latency_s(ranks, p)
    return fixed + nbytes / bw + link.latency_us * 1e-6  # send / recv


@dataclass
class Groups:
    """What the model needs of the job's process groups (filled where they exist)."""

    dims: dict[str, str]  # group name -> mesh dim name
    ranks: dict[str, list[int]]  # group name -> global ranks
    fsdp: frozenset[str]  # groups FSDP's own collectives run on
    data_parallel: frozenset[str]  # groups gradients are reduced over (FSDP, HSDP / DDP replicas)


@dataclass
class Timed:
    """Seconds and their breakdown (a linear quantity: scaled and added)."""

    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    def add(self, other: Timed, k: float = 1.0) -> Timed:
        self.seconds += k * other.seconds
        for name, v in other.parts.items():
            self.parts[name] = self.parts.get(name, 0.0) + k * v
        return self


class Streams:
    """One rank's compute stream and its links, over a sequence of segments (assumption 3)."""

    def __init__(self, p: HardwareProfile, groups: Groups, stretch: float, simple_fsdp_eager: bool):
        self.p, self.groups = p, groups
        self.stretch, self.host_stretch = stretch, max(1.0, stretch)
        self.world = round(stretch * p.cores) if p.cores else 0  # CPU: ranks on the machine
        self.overlap = p.host_async
        self.prefetch = self.overlap and not simple_fsdp_eager
        self.t = 0.0  # the compute stream's clock
        # physical link ("nvlink" / "nic", link_of) -> when it is free: every mesh dim whose
        # group crosses nodes shares the rank's NIC, every one inside a node its NVLink
        self.link_free: dict[str, float] = defaultdict(float)
        self.unit_start = None  # when the unit of the last FSDP gather started computing
        self.backward_gather = None  # (end, dim) of the gather the next unit's backward waits for
        self.pending: dict[str, float] = {}  # dim -> end of reductions not yet waited for
        self.parts: dict[str, float] = defaultdict(float)
        # CPU: the ranks drift apart while computing; a blocking collective waits for the last
        self.skew = 0.0 if self.overlap else sync_skew(p, self.world)
        self.computed = 0.0  # busy seconds since the last blocking collective

    def compute(self, c: Compute, label: str) -> None:
        device = (c.device_s + c.recompute_s) * self.stretch
        host = c.host_s * self.host_stretch
        busy = max(device, host) if self.p.host_async else device + host
        if label in TAIL_LABELS:
            self.parts["optimizer"] += busy
        else:
            self.parts["compute"] += c.device_s * self.stretch
            self.parts["recompute"] += c.recompute_s * self.stretch
            self.parts["overhead"] += busy - device
        self.t += busy
        self.computed += busy

    def comm(self, c: Comm, label: str) -> None:
        if c.kind in ("send", "recv"):
            return  # pipeline P2P: pipeline_seconds
        dim = self.groups.dims.get(c.group, "world")
        ranks = self.groups.ranks.get(c.group, [0])
        duration = collective_seconds(c.kind, c.nbytes, ranks, self.p, self.world) * c.share
        if duration <= 0:
            return
        duration += self.skew * self.computed
        self.computed = 0.0
        link = link_of(ranks, self.p).name
        free = self.link_free[link]
        # FSDP's parameter gathers (forward, backward); one in the tail (an optimizer's, Muon's
        # whole matrices) is waited for where it is issued
        gather = c.kind == "all_gather" and c.group in self.groups.fsdp and label not in TAIL_LABELS
        reduction = (
            self.overlap
            and phase_of(label) in BACKWARD
            and c.kind in ("reduce_scatter", "all_reduce")
            and c.group in self.groups.data_parallel
        )
        if gather and self.prefetch and c.api == "c10d" and phase_of(label) in BACKWARD:
            # FSDP2's backward prefetch: the gather issued in a unit's pre-backward is the next
            # unit's; the unit itself waits for the one issued a unit earlier
            if self.backward_gather is not None:
                self._wait(*self.backward_gather)
            end = max(free, self.t) + duration
            self.link_free[link] = end
            self.backward_gather = (end, dim)
        elif gather and self.prefetch:
            issued = self.t if self.unit_start is None else self.unit_start
            end = max(free, issued) + duration
            self.link_free[link] = end
            self._wait(end, dim)
            self.unit_start = self.t
        elif reduction:
            end = max(free, self.t) + duration
            self.link_free[link] = end
            self.pending[dim] = max(end, self.pending.get(dim, 0.0))
        else:
            end = max(free, self.t) + duration
            self.link_free[link] = end
            self._wait(end, dim)

    def _wait(self, end: float, dim: str) -> None:
        if end > self.t:
            self.parts[f"comm_{dim}"] += end - self.t
            self.t = end

    def settle(self) -> None:
        """Wait for the reductions still running (before clipping / at the end of a pipeline action)."""
        for dim, end in self.pending.items():
            self._wait(end, dim)
        self.pending.clear()
        if self.backward_gather is not None:
            self._wait(*self.backward_gather)
            self.backward_gather = None

    def run(self, segments: list[Segment]) -> Timed:
        start, before = self.t, dict(self.parts)
        for seg in segments:
            if seg.label in TAIL_LABELS:
                self.settle()
            for e in seg.events:
                if isinstance(e, Compute):
                    self.compute(e, seg.label)
                else:
                    self.comm(e, seg.label)
        self.settle()
        return Timed(
            self.t - start,
            {k: v - before.get(k, 0.0) for k, v in self.parts.items() if v - before.get(k, 0.0)},
        )


@dataclass
class RankTimes:
    """One simulated pipeline rank's times (a linear quantity, for the block extrapolation)."""

    serial: Timed  # without a pipeline: the whole forward/backward of the step
    # with one: (stage, "F" | "B" | "I" | "W", microbatch) -> that action's time (the mean of
    # its runs under gradient accumulation); (stage, "R", None): the stage's gradient
    # reduction after its last backward (torch 2.13 reduces a pipeline's gradients once)
    actions: dict[tuple, Timed]
    tail: Timed  # the step tail: tied copies, clipping, the optimizer, the expert balance
    p2p_s: float = 0.0  # one stage-boundary transfer (the largest P2P) over the pipeline link

    def action(self, stage: int, kind: str, mb: int | None) -> Timed:
        """The time of one action. A microbatch past those simulated (the layout search times
        more than it simulates) takes the last simulated microbatch's time: the steady state,
        not the first microbatch's, which alone gathers the stage's parameters. A zero-bubble
        input backward ("I") simulated as a full backward takes its time; a stage that ran weight
        actions but no input ones (the first stage) has none to take. Fails for an action the
        simulation did not run: a missing action is not free."""
        for k in (kind, "B") if kind == "I" else (kind,):
            got = self.actions.get((stage, k, mb))
            if got is not None:
                return got
            ran = [m for (s, kk, m) in self.actions if s == stage and kk == k and m is not None]
            if mb is not None and ran and mb > max(ran):
                return self.actions[(stage, k, max(ran))]
        if kind == "I" and any(s == stage and k == "W" for s, k, _ in self.actions):
            # the first stage has no input to differentiate (token ids): torch runs its whole
            # backward in the weight action, so its input action is simulated as nothing
            if not any(s == stage and k in ("I", "B") for s, k, _ in self.actions):
                return Timed()
        raise KeyError(
            f"step-time model: the simulated step ran no {kind} action of stage {stage}"
            f" microbatch {mb} (simulated: {sorted(self.actions, key=str)})"
        )

    def reductions(self) -> list[tuple]:
        """The gradient-reduction actions (stage, "R", None) the simulation ran."""
        return sorted(k for k in self.actions if k[1] == "R")

    def combined(self, other: RankTimes, a: float, b: float) -> RankTimes:
        """a x self + b x other."""
        keys = set(self.actions) | set(other.actions)
        acts = {
            k: Timed().add(self.actions.get(k, Timed()), a).add(other.actions.get(k, Timed()), b)
            for k in keys
        }
        return RankTimes(
            Timed().add(self.serial, a).add(other.serial, b),
            acts,
            Timed().add(self.tail, a).add(other.tail, b),
            max(self.p2p_s, other.p2p_s),
        )

    def restaged(self, stages: dict[int, int]) -> RankTimes:
        """The same times for another rank whose stages are `stages[own stage]` (alike stages)."""
        acts = {(stages.get(st, st), kind, mb): t for (st, kind, mb), t in self.actions.items()}
        return RankTimes(self.serial, acts, self.tail, self.p2p_s)


def rank_times(
    segments: list[Segment],
    p: HardwareProfile,
    groups: Groups,
    stretch: float,
    simple_fsdp_eager: bool,
) -> RankTimes:
    body = [s for s in segments if s.label not in TAIL_LABELS]
    tail = [s for s in segments if s.label in TAIL_LABELS]
    p2p = [
        e for s in segments for e in s.events if isinstance(e, Comm) and e.kind in ("send", "recv")
    ]
    largest = max(p2p, key=lambda e: e.nbytes, default=None)
    p2p_s = (
        0.0
        if largest is None
        else collective_seconds(
            "send",
            largest.nbytes,
            groups.ranks.get(largest.group, [0, 1]),
            p,
            round(stretch * p.cores),
        )
    )
    if not any(s.action is not None for s in body):
        serial = Streams(p, groups, stretch, simple_fsdp_eager).run(body)
        actions = {}
    else:
        serial = Timed()
        # one entry per run of an action: with gradient accumulation the schedule runs once
        # per accumulation step, each time with the same (stage, kind, microbatch) actions
        by_action: dict[tuple, list[Segment]] = defaultdict(list)
        runs: dict[tuple, int] = defaultdict(int)
        previous = None
        for s in body:
            if s.action is not None and s.label not in PIPELINE_LABELS:
                if s.action != previous:
                    runs[s.action] += 1
                by_action[(*s.action, runs[s.action])].append(s)
                previous = s.action
        per_action: dict[tuple, list[Timed]] = defaultdict(list)
        for (stage, kind, mb, _run), segs in by_action.items():
            per_action[(stage, kind, mb)].append(
                Streams(p, groups, stretch, simple_fsdp_eager).run(segs)
            )
        actions = {k: Timed().add(_mean(v)) for k, v in per_action.items()}
    return RankTimes(
        serial, actions, Streams(p, groups, stretch, simple_fsdp_eager).run(tail), p2p_s
    )


def _mean(items: list[Timed]) -> Timed:
    out = Timed()
    for t in items:
        out.add(t, 1.0 / len(items))
    return out


# ---------------------------------------------------------------------------- per role


@dataclass
class RoleTime:
    role: str
    ranks: list[int]
    predicted_step_seconds: float
    tokens_per_second_per_device: float
    mfu: float | None
    breakdown: dict[
        str, float
    ]  # seconds: compute, recompute, overhead, optimizer, comm_<dim>, pipeline_bubble

    def record(self) -> dict:
        """The plan.json `step_time_per_rank_role` entry (a stable format: tools read it)."""
        return {
            "role": self.role,
            "ranks": self.ranks,
            "predicted_step_seconds": self.predicted_step_seconds,
            "tokens_per_second_per_device": self.tokens_per_second_per_device,
            "mfu": self.mfu,
            "breakdown": self.breakdown,
        }


@dataclass
class StepShape:
    """What turns seconds into throughput."""

    tokens_per_step: int  # global batch x sequence
    world: int
    flops_per_token: float  # the trainer's MFU numerator (model.flops_per_token)
    peak_flops: float  # the trainer's MFU denominator on this hardware
    accum_steps: int  # pipeline schedules per step (gradient accumulation)
    busy_rates: tuple[float, ...] = ()  # a CPU pipeline's speed by ranks computing (busy_rates)


def with_reductions(order: dict[int, list], times: dict[int, RankTimes]) -> dict[int, list]:
    """`order` with each rank's gradient reductions after its last action: under PP + FSDP
    torch 2.13 reduce-scatters a stage's gradients once, after the schedule's last backward
    (the simulation traces it as the action (stage, "R", None)); the schedules' orders leave
    it out, and its time would never reach the step."""
    out = {}
    for r, acts in order.items():
        own = {a[0] for item in acts for a in (item if isinstance(item, list) else [item])}
        extra = [k for k in times[r].reductions() if k[0] in own] if r in times else []
        out[r] = list(acts) + extra
    return out


def role_times(
    roles: list[tuple[str, list[int], int]],
    times: dict[int, RankTimes],
    schedule: tuple | None,
    shape: StepShape,
) -> list[RoleTime]:
    """roles: (name, global ranks, pipeline rank); times: every pipeline rank's RankTimes."""
    if schedule is None:
        t = times[0]
        step = t.serial.seconds + t.tail.seconds
        parts = {r: Timed().add(times[r].serial).add(times[r].tail).parts for _, _, r in roles}
    else:
        order, n_stages = schedule
        order = with_reductions(order, times)
        stage_rank = {
            a[0]: r
            for r, acts in order.items()
            for item in acts
            for a in (item if isinstance(item, list) else [item])
        }
        p2p_s = max(t.p2p_s for t in times.values())
        end, busy = pipeline_seconds(
            order, stage_rank, times, p2p_s, n_stages, rates=shape.busy_rates
        )
        tail = max(t.tail.seconds for t in times.values())
        step = shape.accum_steps * end + tail
        parts = {}
        for _, _, r in roles:
            total = Timed()
            for item in order[r]:
                for action in item if isinstance(item, list) else [item]:
                    total.add(times[r].action(*action), shape.accum_steps)
            if shape.busy_rates and total.seconds > 0:
                # on shared cores an action's wall time is not its time at all ranks busy:
                # its parts scaled to the rank's busy wall time, so that the breakdown sums
                # to the step
                total = Timed().add(total, shape.accum_steps * busy[r] / total.seconds)
            total.add(times[r].tail)
            total.parts["pipeline_bubble"] = max(
                0.0, step - times[r].tail.seconds - shape.accum_steps * busy[r]
            )
            parts[r] = total.parts
    tps = shape.tokens_per_step / step / shape.world if step > 0 else 0.0
    mfu = tps * shape.flops_per_token / shape.peak_flops if shape.peak_flops else None
    return [
        RoleTime(name, ranks, step, tps, mfu, {k: v for k, v in sorted(parts[r].items()) if v > 0})
        for name, ranks, r in roles
    ]


def time_table(times: list[RoleTime]) -> str:
    """The dry run's per-role step-time table (milliseconds)."""
    names = sorted(
        {k for t in times for k in t.breakdown},
        key=lambda k: (k.startswith("comm_"), k == "pipeline_bubble", k),
    )
    head = ["role", "step s", "tok/s/dev", "MFU"] + [
        n.replace("comm_", "comm ").replace("pipeline_bubble", "bubble") + " ms" for n in names
    ]
    rows = [head]
    for t in times:
        rows.append(
            [
                t.role,
                f"{t.predicted_step_seconds:.3f}",
                f"{t.tokens_per_second_per_device:,.0f}",
                "n/a" if t.mfu is None else f"{t.mfu:.1%}",
            ]
            + [f"{t.breakdown.get(n, 0) * 1e3:.1f}" for n in names]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
