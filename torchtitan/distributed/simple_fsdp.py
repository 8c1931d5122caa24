"""SimpleFSDP: data parallelism as ordinary ops inside each FSDP unit's forward.

Each parameter is stored as a DTensor sharded on dim 0 over the data-parallel mesh (with TP,
on the 2-D (dp_shard, tp) mesh, laid out like FSDP2's so a dp all-gather yields the TP
shard). Parameter names, state dicts and DCP checkpoints are those of the plain model.

Per FSDP unit of the plan (embeddings, a block, a block's routed experts, the root), the
unit's forward starts with ONE op (GATHER_OP): its local shards concatenated and cast to
the param dtype, one all-gather, and the copy-out into per-parameter tensors (as FSDP2
copies out of its all-gather buffer); the module reads those for the duration of its
forward. Backward joins their gradients into one buffer and reduce-scatters it (and, for
HSDP / DDP, all-reduces it over dp_replicate) in the reduce dtype, averaged over the
data-parallel ranks: one collective per unit and direction.

Because the gather is an op inside the unit's forward, activation checkpointing and
torch.compile see it: activation_checkpoint.py decides per region whether it is saved or
recomputed (reshard_after_forward and fsdp_ac_policy), recognising it by its process group.
An eager unit that reshards without an AC region re-gathers through saved-tensor hooks.

Under pipeline parallel a unit the plan keeps is gathered once per pipeline step instead:
the first microbatch's forward gathers (outside any AC region or compiled graph, from a
forward pre-hook), every microbatch reuses those tensors, their gradients are summed
unsharded, and the backward of the step's last microbatch reduce-scatters the sum once.
"Last" is counted, not scheduled, so it holds for every schedule, zero-bubble ones included
(their weight pass runs this backward once per microbatch like any other).
"""

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.nn.utils.stateless import _reparametrize_module

from torchtitan.distributed.parallel_dims import DataParallelMesh
from torchtitan.distributed.plan import FsdpUnit, PartPlan, UnitKind
from torchtitan.dtypes import DTYPES

_fc = torch.ops._c10d_functional
# A unit's forward receives its input from a pre-hook on the outermost wrapper, i.e. from
# outside any AC region or compiled graph: its local shards as plain tensors (no DTensor
# enters the region: AOTAutograd in torch 2.13 cannot save a DTensor input's backward
# metadata under whole-block recompute), or, gathered once per step, its values.
_SHARDS_KWARG, _VALUES_KWARG = "_simple_fsdp_shards", "_simple_fsdp_values"


# the op's schema (positional, as torch.library registers and calls it): exempt from keyword-only
@torch.library.custom_op("torchtitan::simple_fsdp_gather", mutates_args=())
def _gather_op(
    shards: list[torch.Tensor],
    group_size: int,
    group_name: str,
    dtype: torch.dtype,
    numels: list[int],
    shapes: list[int],
) -> list[torch.Tensor]:
    """One unit's local shards -> each parameter's gathered value in `dtype`: one flat cast
    copy, ONE all-gather over `group_name` ("" = nothing to gather) and the copy-out, as one op.
    One op, so an AC policy keeps or recomputes all of it together (recomputing the gather
    but keeping the copies would keep the gathered parameters alive), and recognises it by
    its group. `shapes` holds each gathered shape as (ndim, *sizes)."""
    x = torch.cat([t.reshape(-1).to(dtype) for t in shards])
    if group_name:
        x = _fc.wait_tensor(_fc.all_gather_into_tensor(x.contiguous(), group_size, group_name))
    parts = torch.split_with_sizes_copy(x.view(group_size, -1), numels, dim=1)  # rank-major rows
    return [part.view(shape) for part, shape in zip(parts, _unflatten_shapes(shapes))]


@_gather_op.register_fake  # torch calls it with the op's arguments, positionally
def _(shards, group_size, group_name, dtype, numels, shapes):
    return [shards[0].new_empty(shape, dtype=dtype) for shape in _unflatten_shapes(shapes)]


GATHER_OP = torch.ops.torchtitan.simple_fsdp_gather.default


def _unflatten_shapes(flat: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(flat):
        out.append(flat[i + 1 : i + 1 + flat[i]])
        i += 1 + flat[i]
    return out


@dataclass(frozen=True)
class UnitLayout:
    """How one unit's flat buffer is gathered, split into parameters, and reduced."""

    shard_group: str | None  # all-gather / reduce-scatter group (None: nothing to gather)
    shard_size: int
    replicate_group: str | None  # HSDP / DDP: gradients all-reduced over it
    grad_scale: float  # 1 / every data-parallel rank (experts too: EP already summed their tokens)
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    local_shapes: tuple[torch.Size, ...]  # per parameter, this rank's shard
    gathered_shapes: tuple[torch.Size, ...]  # per parameter, after the dp gather (the TP shard)

    @property
    def local_numels(self) -> list[int]:
        return [s.numel() for s in self.local_shapes]

    def gather(self, shards: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Local shards -> every parameter's gathered value, in the param dtype."""
        shapes = [x for shape in self.gathered_shapes for x in (len(shape), *shape)]
        return tuple(
            GATHER_OP(
                list(shards),
                self.shard_size,
                self.shard_group or "",
                self.param_dtype,
                self.local_numels,
                shapes,
            )
        )

    def join(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Gathered-shape gradients (None: unused) -> one rank-major buffer in the reduce dtype."""
        device = next(g.device for g in grads if g is not None)
        parts = [
            (
                g if g is not None else torch.zeros(shape, dtype=self.param_dtype, device=device)
            ).reshape(self.shard_size, -1)
            for g, shape in zip(grads, self.gathered_shapes)
        ]
        return torch.cat(parts, dim=1).to(self.reduce_dtype)  # .to: no copy when the dtypes agree

    def reduce(
        self, joined: torch.Tensor, like: Sequence[tuple[torch.Size, torch.dtype]]
    ) -> tuple[torch.Tensor, ...]:
        """A joined gradient (consumed) -> this rank's shard of its data-parallel average, one
        tensor per parameter with the (shape, dtype) of `like`."""
        g = joined.reshape(-1).mul_(self.grad_scale)
        if self.shard_group is not None:
            g = _fc.wait_tensor(
                _fc.reduce_scatter_tensor(g, "sum", self.shard_size, self.shard_group)
            )
        if self.replicate_group is not None:
            g = _fc.wait_tensor(_fc.all_reduce(g, "sum", self.replicate_group))
        return tuple(
            part.view(shape).to(dtype)
            for part, (shape, dtype) in zip(g.split(self.local_numels), like)
        )


class _GatherUnit(torch.autograd.Function):
    """Local shards -> gathered parameters; their gradients -> averaged shards. `regather`
    (eager units resharded by saved-tensor hooks, else None) drops the values gathered again
    for this backward as soon as the unit's weight gradients are done."""

    @staticmethod
    def forward(ctx, layout, regather, *shards):
        ctx.layout, ctx.regather = layout, regather
        ctx.like = [(t.shape, t.dtype) for t in shards]
        return layout.gather(shards)

    @staticmethod
    def backward(ctx, *grads):
        layout = ctx.layout
        if ctx.regather is not None:
            ctx.regather.values = None
        return None, None, *layout.reduce(layout.join(grads), ctx.like)


def _storage_key(t: torch.Tensor) -> int:
    """Identifies a tensor's storage: its address, or for a fake tensor (memory simulation),
    whose address is always 0, the storage object (torch keeps one per storage)."""
    if isinstance(t, FakeTensor):
        return id(t.untyped_storage())
    return t.untyped_storage().data_ptr()


class _Regather:
    """Resharding without an AC region, for eager code: while the unit's forward runs,
    autograd saves its gathered parameters (and views of them) as handles, not tensors, so
    they are freed when the forward ends; the first handle unpacked in backward gathers the
    unit again (one all-gather), every handle then views those values. Cheaper than a
    checkpoint region, whose dispatch mode runs Python for every op of the block twice."""

    def __init__(self, unit: "_Unit"):
        self.unit = unit
        self.values: tuple[torch.Tensor, ...] | None = None

    def hooks(self, values):
        where = {_storage_key(v): i for i, v in enumerate(values)}  # ints: nothing kept alive

        def pack(t):
            local = t._local_tensor if isinstance(t, DTensor) else t
            i = where.get(_storage_key(local)) if local.device.type != "meta" else None
            if i is None:
                return t
            spec = (
                (t.device_mesh, t.placements, t.shape, t.stride())
                if isinstance(t, DTensor)
                else None
            )
            return _Handle(i, local.size(), local.stride(), local.storage_offset(), spec)

        def unpack(x):
            if not isinstance(x, _Handle):
                return x
            if self.values is None:
                with torch.no_grad():
                    self.values = self.unit.layout.gather(self.unit.local_shards())
                # also dropped when this backward ends: one that computes input gradients only
                # (a pipeline's shape inference, a zero-bubble input pass) never reaches the
                # unit's _GatherUnit node, which drops them otherwise
                torch.autograd.Variable._execution_engine.queue_callback(self._drop)
            v = self.values[x.index].as_strided(x.size, x.stride, x.offset)
            if x.spec is None:
                return v
            mesh, placements, shape, stride = x.spec
            return DTensor.from_local(
                v, mesh, placements, run_check=False, shape=shape, stride=stride
            )

        return pack, unpack

    def _drop(self) -> None:
        self.values = None


@dataclass(frozen=True)
class _Handle:
    index: int  # which gathered value
    size: torch.Size
    stride: tuple
    offset: int
    spec: tuple | None  # a DTensor's (mesh, placements, shape, stride)


class _StepState:
    """A unit gathered once per pipeline step: its gathered values, the summed gradient and
    how many microbatch backwards it has seen. Only backwards are counted: an AC recompute
    of a region holding the unit runs its forward again, never its backward."""

    def __init__(self, microbatches: int):
        self.microbatches = microbatches
        self.values: tuple[torch.Tensor, ...] | None = None
        self.versions: tuple[int, ...] = ()  # of the parameters the values were gathered from
        self.grad: torch.Tensor | None = None
        self.backwards = 0


class _GatherOncePerStep(torch.autograd.Function):
    """Like _GatherUnit, but gathers only on the first microbatch of a step and reduces
    only in the backward of the last one (earlier ones hand the shards a zero gradient)."""

    @staticmethod
    def forward(ctx, layout, state, versions, *shards):
        ctx.layout, ctx.state = layout, state
        ctx.like = [(t.shape, t.dtype) for t in shards]
        if state.values is not None and versions != state.versions:
            # the optimizer (or a load) changed the parameters while a step was still open
            raise RuntimeError(
                f"SimpleFSDP: a unit gathered once per pipeline step saw {state.backwards} of"
                f" {state.microbatches} microbatch backwards before its parameters changed: every"
                " microbatch's output must reach the loss, and a step must not be abandoned midway"
            )
        if state.values is None:
            state.values, state.versions = layout.gather(shards), versions
        return tuple(v.detach() for v in state.values)  # aliases: one copy serves every microbatch

    @staticmethod
    def backward(ctx, *grads):
        layout, state = ctx.layout, ctx.state
        joined = layout.join(grads)
        state.grad = joined if state.grad is None else state.grad.add_(joined)
        state.backwards += 1
        if state.backwards < state.microbatches:
            # zeros, not None: a zero-bubble weight pass asks autograd for every weight's grad
            return (
                None,
                None,
                None,
                *(
                    torch.zeros(shape, dtype=dtype, device=joined.device)
                    for shape, dtype in ctx.like
                ),
            )
        grad, state.values, state.grad, state.backwards = state.grad, None, None, 0
        return None, None, None, *layout.reduce(grad, ctx.like)


class _Unit:
    """One FSDP unit: the parameters it owns (nested units' excluded), as (owning module,
    attribute, path from the unit's module), and how they are gathered."""

    def __init__(
        self,
        entries,
        layout: UnitLayout,
        tp_specs,
        step: _StepState | None,
        regather: bool,
        *,
        aliases=(),
    ):
        self.entries, self.layout, self.tp_specs, self.step = entries, layout, tp_specs, step
        self.aliases = tuple(
            aliases
        )  # (path, entry index): another module's name for an entry's parameter
        self.regather = _Regather(self) if regather else None

    def local_shards(self) -> tuple[torch.Tensor, ...]:
        """Views of this rank's shards (no copy: an AC region keeps its inputs until backward)."""
        return tuple(owner._parameters[attr].to_local() for owner, attr, _ in self.entries)

    def bind(self, values: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """{path: value} for the unit's forward; TP parameters become DTensors on their TP mesh."""
        out = {}
        for (_, _, path), value, tp in zip(self.entries, values, self.tp_specs):
            if tp is not None:
                mesh, placements, shape, stride = tp
                value = DTensor.from_local(
                    value, mesh, placements, run_check=False, shape=shape, stride=stride
                )
            out[path] = value
        for path, index in self.aliases:
            out[path] = out[self.entries[index][2]]
        return out

    def inputs(self) -> dict[str, tuple[torch.Tensor, ...]]:
        """What the unit's forward starts from: its local shards (gathered in the forward, so
        AC and compile see the gather), or its values when gathered once per step. The first
        traces into a compiled block (a nested unit costs no graph break)."""
        if self.step is None:
            return {_SHARDS_KWARG: self.local_shards()}
        return self._step_inputs()

    @torch._dynamo.disable
    def _step_inputs(self) -> dict[str, tuple[torch.Tensor, ...]]:
        # Python state shared across microbatches (the cache, the backward count): eager
        if not torch.is_grad_enabled():  # shape inference, evaluation: nothing to cache or reduce
            return {_VALUES_KWARG: self.layout.gather(self.local_shards())}
        # (the DTensor parameters' versions: in-place updates bump them, not their local tensors')
        versions = tuple(owner._parameters[attr]._version for owner, attr, _ in self.entries)
        return {
            _VALUES_KWARG: _GatherOncePerStep.apply(
                self.layout, self.step, versions, *self.local_shards()
            )
        }


_UNIT_CLASSES: dict[type, type] = {}


def _unit_class(cls: type) -> type:
    """The SimpleFSDP subclass of a module class, one per class: torch.compile guards on a
    module's type, so a fresh subclass per block would recompile every block."""
    if cls not in _UNIT_CLASSES:

        def forward(self, *args, **kwargs):
            unit = self._simple_fsdp_unit
            if (
                _SHARDS_KWARG not in kwargs and _VALUES_KWARG not in kwargs
            ):  # called without the pre-hook
                kwargs.update(unit.inputs())
            values = kwargs.pop(_VALUES_KWARG, None)  # gathered once per step
            if values is None:
                values = _GatherUnit.apply(unit.layout, unit.regather, *kwargs.pop(_SHARDS_KWARG))
            saving = (
                torch.autograd.graph.saved_tensors_hooks(*unit.regather.hooks(values))
                if unit.regather is not None
                else contextlib.nullcontext()
            )
            with saving, _reparametrize_module(self, unit.bind(values)):
                return cls.forward(self, *args, **kwargs)

        _UNIT_CLASSES[cls] = type(f"SimpleFSDP{cls.__name__}", (cls,), {"forward": forward})
    return _UNIT_CLASSES[cls]


def _settled(x):
    # TP's async redistributes hand blocks an AsyncCollectiveTensor; a compiled block would
    # take it as a tensor-subclass input and return its gradient unwrapped, which breaks the
    # redistribute's backward (torch 2.13). Waiting through the op keeps the autograd graph.
    return funcol.wait_tensor(x) if isinstance(x, funcol.AsyncCollectiveTensor) else x


def _pass_inputs(unit: _Unit):
    def hook(module, args, kwargs):
        kwargs = {k: _settled(v) for k, v in kwargs.items()}
        return tuple(_settled(a) for a in args), {**kwargs, **unit.inputs()}

    return hook


def _dp_placement(tp_mesh, tp_placements: list):
    # A parameter the model-parallel dims already split on dim 0 (TP's column split; EP's
    # experts, ETP's 2-D (ep, tp) mesh) is split again on dim 0 for dp in model-major order,
    # so that gathering over dp yields exactly this rank's shard; only the dims that split
    # dim 0 count (ETP's tp dim splits another one).
    split = 1
    for i, placement in enumerate(tp_placements):
        if isinstance(placement, Shard) and placement.dim == 0:
            split *= tp_mesh.size(i)
    return _StridedShard(0, split_factor=split) if split > 1 else Shard(0)


def _shard_param(param: nn.Parameter, dp: DataParallelMesh, kind: UnitKind) -> nn.Parameter:
    """A meta parameter (plain, or a TP / EP DTensor) -> a DTensor on the data-parallel dims
    (+ its model-parallel dim), sharded on dim 0 over the shard dim when there is one."""
    if isinstance(param, DTensor):
        tp_mesh, tp_placements, local = param.device_mesh, list(param.placements), param.to_local()
        full_mesh = dp.with_model_dim(tp_mesh)
    else:
        tp_mesh, tp_placements, local = None, [], param.data
        full_mesh = dp.mesh
    placements = [Replicate()] * len(dp.dims)
    if dp.shard is not None:
        shard_coord, shard_size = dp.local_rank(dp.shard), dp.size(dp.shard)
        if local.shape[0] % shard_size:
            what = (
                "data_parallel_shard_degree / (expert_parallel_degree / tensor_parallel_degree)"
                if kind is UnitKind.EXPERTS
                else "data_parallel_shard_degree"
            )
            raise ValueError(
                f"--parallelism.fsdp_implementation=simple_fsdp: a parameter of shape {tuple(param.shape)} has"
                f" dim 0 = {local.shape[0]} on this TP/EP rank, not divisible by {what} = {shard_size} (SimpleFSDP"
                " does not pad); use fsdp2 or other degrees"
            )
        placements[dp.dims.index(dp.shard)] = _dp_placement(tp_mesh, tp_placements)
        local = local.chunk(shard_size, dim=0)[shard_coord]
    dt = DTensor.from_local(
        local,
        full_mesh,
        placements + tp_placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )
    return nn.Parameter(dt, requires_grad=param.requires_grad)


def unwrap(module: nn.Module) -> nn.Module:
    """The module itself under torch.compile's and activation checkpointing's wrappers."""
    while True:
        inner = getattr(module, "_orig_mod", None) or getattr(
            module, "_checkpoint_wrapped_module", None
        )
        if inner is None:
            return module
        module = inner


def gathers_once_per_step(unit: FsdpUnit, microbatches: int) -> bool:
    """Under PP a unit the plan keeps is gathered once per step, unless its AC region
    recomputes FSDP's gathers (fsdp_ac_policy=recompute asks for a gather per microbatch,
    redone in backward)."""
    region = unit.region
    return (
        microbatches > 1
        and not unit.reshard
        and (region is None or region.fsdp_comm != "recompute")
    )


def regathers_by_hooks(unit: FsdpUnit) -> bool:
    """A resharded unit whose region leaves the re-gather to saved-tensor hooks (eager)."""
    return unit.reshard and unit.region is not None and unit.region.by_hooks


def simple_fsdp(
    model: nn.Module,
    plan: PartPlan,
    mesh_of: Callable[[UnitKind], DataParallelMesh],
    param_dtype: str,
    reduce_dtype: str,
) -> nn.Module:
    """Make every unit of `plan` a SimpleFSDP unit of `model` (on meta, after TP / EP / AC /
    compile), in place, on its kind's data-parallel mesh (FSDP, HSDP or DDP). Gradients,
    experts' too, are averaged over every data-parallel rank."""
    dense = mesh_of(UnitKind.DENSE)
    dp_size = 1
    for d in dense.dims:
        dp_size *= dense.size(d)
    claimed: set[int] = set()
    # Nested units (experts) first, the root last: a unit owns what no inner unit took.
    for spec in sorted(plan.units, key=lambda u: (u.is_root, -u.name.count("."), -len(u.name))):
        holder = model.get_submodule(spec.name) if spec.name else model
        module = unwrap(holder)
        dp = mesh_of(spec.kind)
        entries, local_shapes, shapes, tp_specs = [], [], [], []
        aliases, seen = [], {}  # a parameter two modules share (tied embeddings): sharded once
        for path, param in list(module.named_parameters(remove_duplicate=False)):
            if id(param) in claimed:
                continue
            owner_path, _, attr = path.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            if id(param) in seen:
                index = seen[id(param)]
                owner._parameters[attr] = entries[index][0]._parameters[entries[index][1]]
                aliases.append((path, index))
                continue
            seen[id(param)] = len(entries)
            is_tp = isinstance(param, DTensor)
            tp_specs.append(
                (param.device_mesh, tuple(param.placements), param.shape, param.stride())
                if is_tp
                else None
            )
            sharded = _shard_param(param, dp, spec.kind)
            owner._parameters[attr] = sharded
            claimed.add(id(sharded))
            local = sharded.to_local()
            entries.append((owner, attr, path))
            local_shapes.append(local.shape)
            shapes.append(torch.Size((local.shape[0] * dp.size(dp.shard), *local.shape[1:])))
        if not entries:
            continue
        gathers = dp.size(dp.shard) > 1  # (experts: EP may take all of dp_shard)
        layout = UnitLayout(
            shard_group=dp.group_name(dp.shard) if gathers else None,
            shard_size=dp.size(dp.shard),
            replicate_group=dp.group_name(dp.replicate),
            grad_scale=1.0 / dp_size,
            param_dtype=DTYPES[param_dtype],
            reduce_dtype=DTYPES[reduce_dtype],
            local_shapes=tuple(local_shapes),
            gathered_shapes=tuple(shapes),
        )
        step = (
            _StepState(plan.microbatches)
            if gathers_once_per_step(spec, plan.microbatches)
            else None
        )
        unit = _Unit(entries, layout, tp_specs, step, regathers_by_hooks(spec), aliases=aliases)
        module._simple_fsdp_unit = unit
        module.__class__ = _unit_class(module.__class__)
        holder.register_forward_pre_hook(_pass_inputs(unit), with_kwargs=True)  # outermost wrapper
    return model
