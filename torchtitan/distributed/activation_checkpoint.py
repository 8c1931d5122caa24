"""Activation checkpointing regions and their policies, built here and only here.

A block's region combines two decisions:
- the user's compute policy: none, full (recompute everything), selective op (keep matmul
  and attention outputs), or selective every n-th block (full AC on those blocks);
- the FSDP communication policy (SimpleFSDP only, whose all-gathers run inside forward):
  "save" keeps a unit's gathered parameters for backward (ZeRO-2 under recompute),
  "recompute" re-gathers them in backward (ZeRO-3).
FSDP's gathers are recognised by their process group (the data-parallel dims), so TP / EP
collectives and every other op stay under the compute policy. A resharding SimpleFSDP unit
without any user AC gets a region that saves everything except its gather under compile;
in eager code the unit re-gathers through saved-tensor hooks instead (RegionSpec.by_hooks).

Op SAC also keeps expert parallel's all-to-alls and context parallel's K/V gathers, and the
wait that completes each: a wait is matched to its own collective by the storage its
argument lives in, not by position, so another collective's wait (TP's) in between is not
taken for it.

torch.utils.checkpoint's own arguments (preserve_rng_state, determinism_check, debug,
early_stop) and op SAC's forced recomputes come from the [activation_checkpoint] keys through
`configure_checkpointing`, called once per build (process-wide, as torch's partitioner
settings are). mode=memory_budget builds no region: the compiler's partitioner chooses what
to recompute within `torch._functorch.config.activation_memory_budget`.
"""

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, partial

import torch
import torch._functorch.config as functorch_config
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)

from torchtitan.config.job_config import ActivationCheckpoint
from torchtitan.distributed.plan import RegionSpec
from torchtitan.distributed.simple_fsdp import GATHER_OP

aten = torch.ops.aten
_fc = torch.ops._c10d_functional
logger = logging.getLogger(__name__)

# A nested FSDP2 unit inside a region (a MoE block's experts) runs its hooks in forward and
# again, differently, in the recompute: they open profiler ranges a different number of
# times, which SAC would take for a changed op sequence. Those ops carry no values; SAC
# leaves the ops in this (exported) set alone.
for _name in ("_record_function_enter_new", "_record_function_enter", "_record_function_exit"):
    _packet = getattr(torch.ops.profiler, _name, None)
    if _packet is not None:
        SAC_IGNORED_OPS.update(getattr(_packet, o) for o in _packet.overloads())

# Compute-heavy ops whose outputs op-level SAC keeps: recomputing them costs the most FLOPs
# per byte saved. Everything else (norms, activations, casts, views) is recomputed.
_ATTENTION_OPS = [
    name
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(aten, name)
]
# The flex and varlen flavors' kernels on CUDA (FlexAttention's higher-order op, varlen_attn's
# flash forward): attention outputs like SDPA's, kept likewise.
_CUDA_ATTENTION = [
    op
    for op in (
        getattr(torch.ops.higher_order, "flex_attention", None),
        getattr(getattr(aten, "_flash_attention_forward", None), "default", None),
    )
    if op is not None
]
SAVE_OPS = {
    aten.mm.default,  # a float8 linear's GEMM too (SAC sees torchao's mm, not _scaled_mm)
    aten.addmm.default,
    aten.bmm.default,
    *(getattr(aten, n).default for n in _ATTENTION_OPS),
    *_CUDA_ATTENTION,
    # the full-tensor max: float8's amaxes (a scalar each; their scales and casts recompute)
    aten.max.default,
}
MUST = {"save": CheckpointPolicy.MUST_SAVE, "recompute": CheckpointPolicy.MUST_RECOMPUTE}


@dataclass(frozen=True)
class CheckpointOptions:
    """What every region passes to torch.utils.checkpoint, from [activation_checkpoint];
    `force_recompute_fqns`: op SAC recomputes the matmuls of these nn.Linear modules' shape."""

    preserve_rng_state: bool = False
    determinism_check: str = "default"
    debug: bool = False
    early_stop: bool = False
    force_recompute_fqns: tuple[str, ...] = ()
    recompute_every_nth_mm: int = 0  # op SAC: 0 saves every mm; n recomputes every n-th

    @classmethod
    def of(cls, ac_cfg: ActivationCheckpoint) -> "CheckpointOptions":
        return cls(
            ac_cfg.preserve_rng_state,
            ac_cfg.determinism_check,
            ac_cfg.debug,
            ac_cfg.early_stop,
            tuple(ac_cfg.per_op_sac_force_recompute_mm_shapes_by_fqns),
            ac_cfg.per_op_sac_recompute_every_nth_mm,
        )

    def checkpoint_kwargs(self) -> dict:
        return {
            "preserve_rng_state": self.preserve_rng_state,
            "determinism_check": self.determinism_check,
            "debug": self.debug,
            "early_stop": self.early_stop,
        }


_OPTIONS = [CheckpointOptions()]  # the configured options (a list: set in place)
_PARTITIONER_KEYS = (
    "activation_memory_budget",
    "visualize_memory_budget_pareto",
    "memory_budget_pareto_dir",
)
_PARTITIONER_DEFAULTS = {k: getattr(functorch_config, k) for k in _PARTITIONER_KEYS}
PARETO_DIR = "memory_budget_pareto"  # under job.dump_folder


def configure_checkpointing(ac_cfg: ActivationCheckpoint, dump_folder: str) -> None:
    """Set the checkpoint options every later `apply_ac` uses and, for mode=memory_budget,
    torch's partitioner budget (read when a compiled graph is partitioned, i.e. on the first
    step: it stays set for the process). Any other mode restores torch's values, so that
    jobs built one after another in a process (tests) do not inherit a budget.
    visualize_memory_budget_pareto: the partitioner writes one SVG per compiled graph and
    rank (memory_budget_pareto_rank_<r>_<graph>.svg, matplotlib) into
    <dump_folder>/memory_budget_pareto."""
    _OPTIONS[0] = CheckpointOptions.of(ac_cfg)
    values = dict(_PARTITIONER_DEFAULTS)
    if ac_cfg.mode == "memory_budget":
        values["activation_memory_budget"] = float(ac_cfg.memory_budget)
        if ac_cfg.visualize_memory_budget_pareto:
            values["visualize_memory_budget_pareto"] = True
            values["memory_budget_pareto_dir"] = os.path.join(dump_folder, PARETO_DIR)
        logger.info(
            "activation checkpointing: memory_budget %g, the compiler's partitioner chooses"
            " what each compiled block recomputes",
            ac_cfg.memory_budget,
        )
    for key, value in values.items():
        setattr(functorch_config, key, value)


def forced_recompute_shapes(
    block: nn.Module, block_name: str, fqns: Iterable[str]
) -> frozenset[tuple[int, int]]:
    """The (in, out) shapes of the nn.Linear modules of `block` whose full name ends with one
    of `fqns` (at a dot): op SAC recomputes every aten.mm whose weight operand (the
    transposed weight, (in, out)) has one of these shapes, whichever module it belongs to
    (upstream's rule). A TP-sharded weight counts with its local shape, the one mm sees."""
    fqns = tuple(fqns)
    shapes = set()
    for name, sub in block.named_modules():
        full = f"{block_name}.{name}" if name else block_name
        if not any(full == f or full.endswith(f".{f}") for f in fqns):
            continue
        if not isinstance(sub, nn.Linear):
            raise ValueError(
                f"--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns: {full}"
                f" is a {type(sub).__name__}, not an nn.Linear; name Linear modules only"
            )
        weight = sub.weight.to_local() if isinstance(sub.weight, DTensor) else sub.weight
        out_features, in_features = weight.shape
        shapes.add((in_features, out_features))
    return frozenset(shapes)


def compute_policy(func: torch._ops.OpOverload) -> CheckpointPolicy:
    """Op policy: keep the outputs of matmuls and attention, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if func in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage a collective's result lives in, as a wait's argument names it. Eager funcol
    hands out the result wrapped in an AsyncCollectiveTensor (of a view of it, after a view
    op such as CP's gather-dim reshape); traced code (compile) waits on the result itself."""
    if isinstance(t, AsyncCollectiveTensor):
        t = t.elem
    try:
        return t.untyped_storage()
    except RuntimeError:  # a storage-less wrapper subclass: holds no collective's result
        return None


def region_policy(
    spec: RegionSpec,
    fsdp_groups: frozenset[str],
    extra_save_ops: Iterable = (),
    save_groups: frozenset[str] = frozenset(),
    *,
    forced_recompute: frozenset[tuple[int, int]] = frozenset(),
    every_nth_mm: int = 0,
) -> Callable:
    """The SAC policy of one region: SimpleFSDP's unit gathers (GATHER_OP: cast, all-gather
    and copy-out as one op) over an FSDP group by the comm decision, every other op by the
    compute decision. Op SAC also keeps the outputs of the model's `extra_save_ops` (e.g.
    expert parallel's all-to-alls, and the wait that completes each), so that recompute
    neither communicates nor routes again, and of the all-gathers on `save_groups` (context
    parallel's K/V gathers) with their waits.

    SAC (torch 2.13) asks the policy once per op, in forward only and after the op ran
    (ctx.op_output); the recompute replays the answers by op and call index. So a kept
    collective's output storage is remembered until a wait on a tensor in that storage
    comes: that wait is its own. A storage, unlike a tensor object, is shared by the views
    and AsyncCollectiveTensor a wait may get instead, also among the functional tensors seen
    while compile traces; held until its wait, it cannot be freed and its identity reused.
    The state is per policy, i.e. per checkpointed call (context_fn builds one per call).
    `forced_recompute`: op SAC recomputes every aten.mm whose second operand has one of
    these (in, out) shapes (`forced_recompute_shapes`) instead of saving it. `every_nth_mm`
    (n >= 2): op SAC recomputes every n-th of the region's other aten.mm calls (the count
    is per call of the region, in forward order: the recompute replays the same answers)."""
    extra_save_ops = frozenset(extra_save_ops)
    wait_op = _fc.wait_tensor.default
    extra_ops = extra_save_ops - {wait_op}
    keep_a2a_waits = wait_op in extra_save_ops
    in_flight: set[torch.UntypedStorage] = set()  # kept collectives' outputs not yet waited
    mm_seen = [0]  # this call's aten.mm calls (every_nth_mm)

    def keep_until_waited(output: torch.Tensor) -> CheckpointPolicy:
        storage = _storage(output)
        if storage is not None:
            in_flight.add(storage)
        return CheckpointPolicy.MUST_SAVE

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if spec.fsdp_comm is not None and func == GATHER_OP and args[2] in fsdp_groups:
            return MUST[spec.fsdp_comm]
        if spec.compute == "op":
            if func == _fc.all_gather_into_tensor.default and args[2] in save_groups:
                return keep_until_waited(ctx.op_output)
            if func == _fc.all_to_all_single.default and args[3] in save_groups:
                return keep_until_waited(ctx.op_output)  # CP's alltoall ring: K/V shifts
            if func == _fc.all_to_all_single.default and func in extra_ops and keep_a2a_waits:
                return keep_until_waited(ctx.op_output)
            if func in extra_ops:
                return CheckpointPolicy.MUST_SAVE
            if func == wait_op and in_flight:
                storage = _storage(args[0])
                if storage in in_flight:
                    in_flight.remove(storage)  # a second wait on it is not the collective's
                    return CheckpointPolicy.MUST_SAVE
            if (
                forced_recompute
                and func == aten.mm.default
                and tuple(args[1].shape) in forced_recompute
            ):
                return CheckpointPolicy.PREFER_RECOMPUTE
            if every_nth_mm and func == aten.mm.default:
                mm_seen[0] += 1
                if mm_seen[0] % every_nth_mm == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return compute_policy(func)
        if spec.compute == "full":
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE  # a region only there to recompute FSDP's gathers

    return policy


def _context(spec: RegionSpec, groups: tuple, extra_save_ops, forced_recompute, every_nth_mm):
    fsdp_groups, save_groups = groups
    return create_selective_checkpoint_contexts(
        region_policy(
            spec,
            fsdp_groups,
            extra_save_ops,
            save_groups,
            forced_recompute=forced_recompute,
            every_nth_mm=every_nth_mm,
        )
    )


@cache
def _context_fn(
    spec: RegionSpec,
    groups: tuple,
    extra_save_ops: frozenset,
    forced_recompute: frozenset,
    every_nth_mm: int = 0,
):
    # One object per distinct region: torch.compile guards on the identity of the context
    # function's arguments, so a fresh one per block recompiled every block (and past the
    # recompile limit, 8, left the remaining blocks eager). `groups`: (FSDP's, saved ones).
    return partial(_context, spec, groups, extra_save_ops, forced_recompute, every_nth_mm)


def wrap_region(
    module: nn.Module,
    spec: RegionSpec,
    fsdp_groups: frozenset[str],
    extra_save_ops: tuple | frozenset = frozenset(),
    save_groups: frozenset[str] = frozenset(),
    *,
    forced_recompute: frozenset[tuple[int, int]] = frozenset(),
    options: CheckpointOptions | None = None,
) -> nn.Module:
    """`module` in its region; `options`: torch.utils.checkpoint's arguments (None: those
    `configure_checkpointing` set)."""
    if not spec.wrapped:
        return module
    kwargs = (options or _OPTIONS[0]).checkpoint_kwargs()
    if spec.compute == "full" and spec.fsdp_comm is None:
        return checkpoint_wrapper(module, **kwargs)  # plain full AC
    # With SimpleFSDP even "recompute everything" goes through a policy naming FSDP's gathers.
    groups = (frozenset(fsdp_groups), frozenset(save_groups))
    forced = frozenset(forced_recompute) if spec.compute == "op" else frozenset()
    nth = (options or _OPTIONS[0]).recompute_every_nth_mm if spec.compute == "op" else 0
    context = _context_fn(spec, groups, frozenset(extra_save_ops), forced, nth)
    return checkpoint_wrapper(module, context_fn=context, **kwargs)


def block_compute(ac_cfg: ActivationCheckpoint, position: int) -> str:
    """The user's compute decision for the block at `position` (0-based) of a model part.
    mode=memory_budget: none, the compiler's partitioner decides (configure_checkpointing)."""
    if ac_cfg.mode in ("none", "memory_budget"):
        return "none"
    if ac_cfg.mode == "full":
        return "full"
    if ac_cfg.selective_ac_option == "op":
        return "op"
    return "full" if position % int(ac_cfg.selective_ac_option) == 0 else "none"


def resolve_fsdp_comm(fsdp_ac_policy: str, reshard: bool, simple_fsdp: bool) -> str | None:
    """Per unit: whether its gathers are saved or recomputed inside its region."""
    if not simple_fsdp:
        return None
    if fsdp_ac_policy == "auto":
        return "recompute" if reshard else "save"
    return fsdp_ac_policy


def region_specs(
    ac_cfg: ActivationCheckpoint,
    block_names: list[str],
    reshard: dict[str, bool],
    simple_fsdp: bool,
    compiled: bool = False,
) -> dict[str, RegionSpec]:
    """{block name: RegionSpec} for the blocks of one model part, in order. `compiled`:
    blocks run under torch.compile, where a re-gather needs a real (SAC) region."""
    specs = {}
    for position, name in enumerate(block_names):
        compute = block_compute(ac_cfg, position)
        if compute == "none":  # no user region: the reshard plan alone decides
            comm = "recompute" if simple_fsdp and reshard.get(name, False) else None
            specs[name] = RegionSpec(compute, comm, by_hooks=comm == "recompute" and not compiled)
        else:
            specs[name] = RegionSpec(
                compute,
                resolve_fsdp_comm(ac_cfg.fsdp_ac_policy, reshard.get(name, False), simple_fsdp),
            )
    return specs


def apply_ac(
    model: nn.Module,
    specs: dict[str, RegionSpec],
    fsdp_groups: frozenset[str],
    extra_save_ops: tuple | frozenset = (),
    save_groups: frozenset[str] = frozenset(),
) -> None:
    """Wrap each named submodule (a block `layers.N`, or the embeddings) in its region,
    with the options `configure_checkpointing` set.
    `save_groups`: op SAC keeps the all-gathers on these groups (context parallel's)."""
    options = _OPTIONS[0]
    for name, spec in specs.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        module = parent.get_submodule(child)
        forced = frozenset()
        if spec.compute == "op" and options.force_recompute_fqns:
            forced = forced_recompute_shapes(module, name, options.force_recompute_fqns)
        wrapped = wrap_region(
            module,
            spec,
            fsdp_groups,
            extra_save_ops,
            save_groups,
            forced_recompute=forced,
            options=options,
        )
        if isinstance(parent, nn.ModuleDict):
            parent[child] = wrapped
        else:
            setattr(parent, child, wrapped)
