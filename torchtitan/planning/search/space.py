"""The layouts the layout search (layout_search.py) chooses from, torch-free.

A layout is every choice `--planning.fit=layout` makes for a model on N devices: the degrees
(dp_replicate, dp_shard, tp, pp, cp, ep), the pipeline schedule and microbatch size, the
activation-checkpoint mode, the reshard policy and the local batch. The global batch (in
sequences), the sequence length, compile and everything else stay as the user set them.

What is enumerated, and why no more:
- tp: powers of two up to the devices of a node (TP's collectives sit on the critical path
  of every block; across nodes they would be NIC-bound);
- cp: powers of two while each rank keeps >= 2,048 tokens of a sequence;
- pp: powers of two up to 16 with >= 2 blocks per stage, schedules 1F1B and Interleaved1F1B
  (two stages per rank, as torchtitan's published 405B runs), microbatches of 1 or 2
  sequences (1F1B: at least one per stage; Interleaved1F1B: a microbatch count its rounds
  divide); uneven block counts
  split as evenly as possible (split points, the larger stages in the middle: the first and
  last hold the embeddings and the output). The zero-bubble schedules (ZBV, DualPipeV) are
  left out: the composed model (compose.py) has no split backward; the dry run predicts
  them when the job sets one;
- ep (models with routed experts): powers of two that are multiples of tp x cp and divide
  the experts;
- dp_replicate: 1 (FSDP over every data-parallel rank), the replicas that keep each FSDP
  group inside a node (HSDP), and DDP (dp_shard 1);
- AC: none, op SAC (every matmul saved), torchtitan's op SAC (every 2nd matmul recomputed),
  layer SAC (every 2nd block), full (SEARCH_AC);
- reshard: auto, and the fixed policy auto does not resolve to: without PP auto reshards
  every block (as `always` does), so `never` is the other choice; under PP auto keeps every
  unit (as `never`), so `always` is;
- local batch: every divisor of (global batch / data-parallel degree), the rest of the
  global batch made up by gradient accumulation;
- float8 linears on and off with planning.layout_float8 = choose (Layout.float8 None: the
  job's model.converters as configured).
The pre-launch checks (checks/job.py) then refuse what cannot run (e.g. heads TP cannot
split, microbatches a schedule cannot take), and the model-states floor what cannot fit.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from torchtitan.config.quantize_sections import FLOAT8_LINEAR, float8_linear_on
from torchtitan.distributed.job_shape import Degrees, degrees
from torchtitan.planning.memory.fit import AC_CHOICES  # every AC mode the fit tries

# the search's AC modes: the fit's, with op SAC both ways (every matmul saved / every 2nd
# recomputed, torchtitan's policy); each sets every key it depends on
SEARCH_AC = (
    AC_CHOICES[0],
    ("op", {**dict(AC_CHOICES)["op"], "per_op_sac_recompute_every_nth_mm": 0}),
    ("op2", {**dict(AC_CHOICES)["op"], "per_op_sac_recompute_every_nth_mm": 2}),
    *AC_CHOICES[2:],
)
MIN_CP_TOKENS = 2048  # tokens of a sequence a context-parallel rank keeps at least
MAX_PP = 16  # deepest pipeline searched (DeepSeek-V3's; a 32-stage step takes minutes to simulate)


@dataclass(frozen=True)
class Layout:
    degrees: Degrees  # dp_replicate, dp_shard, tp, pp, cp, ep (and the world they multiply to)
    schedule: str  # "" without PP
    microbatch: int  # sequences per pipeline microbatch (1 without PP)
    ac: str  # a SEARCH_AC label
    reshard: str
    local_batch: int
    split_points: tuple[str, ...] = ()
    float8: bool | None = None  # float8 linears on / off; None: as the job has them

    def overrides(self, global_batch: int) -> list[str]:
        """The exact command-line overrides that set this layout."""
        ac = dict(SEARCH_AC)[self.ac]
        d = self.degrees
        out = [
            f"--parallelism.data_parallel_replicate_degree={d.dp_replicate}",
            f"--parallelism.data_parallel_shard_degree={d.dp_shard}",
            f"--parallelism.tensor_parallel_degree={d.tp}",
            f"--parallelism.pipeline_parallel_degree={d.pp}",
            f"--parallelism.context_parallel_degree={d.cp}",
            f"--parallelism.expert_parallel_degree={d.ep}",
        ]
        if d.pp > 1:
            out += [
                f"--parallelism.pipeline_parallel_schedule={self.schedule}",
                f"--parallelism.pipeline_parallel_microbatch_size={self.microbatch}",
                "--parallelism.pipeline_parallel_layers_per_stage=auto",
                f"--parallelism.pipeline_parallel_split_points={','.join(self.split_points)}",
            ]
        out += [f"--activation_checkpoint.{k}={v}" for k, v in ac.items()]
        out += [
            f"--parallelism.reshard_after_forward={self.reshard}",
            f"--training.local_batch_size={self.local_batch}",
            f"--training.global_batch_size={global_batch}",
        ]
        if self.float8 is not None:  # float8 linears are the only converter a job can run
            out.append(f"--model.converters={FLOAT8_LINEAR if self.float8 else ''}")
        return out

    def short(self) -> str:
        """'dp 2x4 tp 8 pp 4 (1F1B, mb 1) cp 1 ep 1 | AC full | reshard auto | local 2'."""
        d = self.degrees
        pp = f"pp {d.pp} ({self.schedule}, mb {self.microbatch})" if d.pp > 1 else "pp 1"
        ep = f" ep {d.ep}" if d.ep > 1 else ""
        return (
            f"dp {d.dp_replicate}x{d.dp_shard} tp {d.tp} {pp} cp {d.cp}{ep} | AC {self.ac}"
            f" | reshard {self.reshard} | local {self.local_batch}"
            + (" | float8" if self.float8 else "")
        )


def apply(cfg, layout: Layout, global_batch: int):
    """`cfg` with `layout`'s choices (a JobConfig; nothing else changes)."""
    d = layout.degrees
    p = dataclasses.replace(
        cfg.parallelism,
        data_parallel_replicate_degree=d.dp_replicate,
        data_parallel_shard_degree=d.dp_shard,
        tensor_parallel_degree=d.tp,
        pipeline_parallel_degree=d.pp,
        context_parallel_degree=d.cp,
        expert_parallel_degree=d.ep,
        pipeline_parallel_schedule=layout.schedule or cfg.parallelism.pipeline_parallel_schedule,
        pipeline_parallel_microbatch_size=layout.microbatch,
        pipeline_parallel_layers_per_stage="auto",
        pipeline_parallel_split_points=list(layout.split_points),
        reshard_after_forward=layout.reshard,
    )
    ac = dataclasses.replace(cfg.activation_checkpoint, **dict(SEARCH_AC)[layout.ac])
    t = dataclasses.replace(
        cfg.training, local_batch_size=layout.local_batch, global_batch_size=global_batch
    )
    model = cfg.model
    if layout.float8 is not None:
        model = dataclasses.replace(model, converters=[FLOAT8_LINEAR] if layout.float8 else [])
    return dataclasses.replace(
        cfg, model=model, parallelism=p, activation_checkpoint=ac, training=t
    )


def _powers(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def split_points(n_layers: int, stages: int) -> tuple[str, ...]:
    """Stage boundaries of `n_layers` blocks in `stages` stages, as even as possible, the
    stages with one block more in the middle (the ends hold the embeddings and the output)."""
    base, extra = divmod(n_layers, stages)
    order = sorted(range(stages), key=lambda s: abs(s - (stages - 1) / 2))  # middle first
    sizes = [base + (1 if s in set(order[:extra]) else 0) for s in range(stages)]
    edges, total = [], 0
    for size in sizes[:-1]:
        total += size
        edges.append(f"layers.{total}")
    return tuple(edges)


def _schedulable(schedule: str, pp: int, microbatches: int) -> bool:
    """1F1B takes at least one microbatch per stage; Interleaved1F1B runs rounds of
    microbatches (torch 2.13: max(1, n // pp) rounds that must divide n). As the pre-launch
    checks (distributed/pipeline_layout.py) refuse otherwise."""
    if schedule == "1F1B":
        return microbatches >= pp
    if schedule != "Interleaved1F1B":
        return True
    rounds = max(1, microbatches // pp)
    return microbatches % rounds == 0


def enumerate_layouts(
    world: int,
    gpus_per_node: int,
    *,
    global_batch: int,
    seq_len: int,
    n_layers: int,
    n_experts: int = 0,
    float8: tuple[bool | None, ...] = (None,),
    replicate: bool = True,
) -> list[Layout]:
    """Every layout of the module docstring for `world` devices (before the checks);
    `replicate` False: no replicate dimension (fault tolerance's replica groups are it)."""
    out = []
    for tp in _powers(min(gpus_per_node, world)):
        for cp in _powers(world // tp):
            if cp > 1 and seq_len // cp < MIN_CP_TOKENS:
                continue
            for pp in _powers(min(world // (tp * cp), MAX_PP)):
                if pp > 1 and n_layers < 2 * pp:
                    continue
                dp = world // (tp * cp * pp)
                if world % (tp * cp * pp) or global_batch % dp:
                    continue
                per_rank = global_batch // dp  # sequences a data-parallel rank takes per step
                replicates = {1, dp}
                if gpus_per_node % (tp * cp) == 0 and dp % (gpus_per_node // (tp * cp)) == 0:
                    replicates.add(dp // (gpus_per_node // (tp * cp)))
                if not replicate:
                    replicates = {1}
                schedules = [("", 1, ())]
                if pp > 1:
                    schedules = [("1F1B", mb, split_points(n_layers, pp)) for mb in (1, 2)]
                    if n_layers >= 4 * pp:  # two stages per rank of >= 2 blocks
                        schedules += [
                            ("Interleaved1F1B", mb, split_points(n_layers, 2 * pp)) for mb in (1, 2)
                        ]
                eps = [1]
                if n_experts:
                    eps = [
                        e
                        for e in _powers(min(n_experts, world))
                        if e % (tp * cp) == 0 and n_experts % e == 0 and (e // (tp * cp)) <= dp
                    ]
                for rep in sorted(replicates):
                    shard = dp // rep
                    for ep in eps:
                        if ep > 1 and shard % (ep // (tp * cp)):
                            continue
                        for schedule, mb, splits in schedules:
                            for local in _divisors(per_rank):
                                if local % mb or not _schedulable(schedule, pp, local // mb):
                                    continue
                                for ac, _ in SEARCH_AC:
                                    reshards = ["auto"] + (
                                        [("always" if pp > 1 else "never")] if shard > 1 else []
                                    )
                                    for reshard, f8 in itertools.product(reshards, float8):
                                        out.append(
                                            Layout(
                                                Degrees(rep, shard, tp, pp, ep, world, cp),
                                                schedule,
                                                mb,
                                                ac,
                                                reshard,
                                                local,
                                                splits,
                                                f8,
                                            )
                                        )
    return out


def layout_of(
    cfg, world: int, global_batch: int, n_layers: int, float8_choice: bool = False
) -> Layout | None:
    """The layout a job as configured has (to show its rank), None if outside the space;
    `float8_choice`: the search chooses float8 (the layout states the job's)."""
    p, a = cfg.parallelism, cfg.activation_checkpoint
    d = degrees(cfg, world)
    ac = next(
        (label for label, v in SEARCH_AC if all(getattr(a, k) == x for k, x in v.items())),
        None,
    )
    if ac is None:
        return None
    splits = tuple(p.pipeline_parallel_split_points)
    return Layout(
        d,
        p.pipeline_parallel_schedule if d.pp > 1 else "",
        p.pipeline_parallel_microbatch_size if d.pp > 1 else 1,
        ac,
        p.reshard_after_forward,
        cfg.training.local_batch_size,
        splits if d.pp > 1 else (),
        float8_linear_on(cfg.model.converters) if float8_choice else None,
    )
