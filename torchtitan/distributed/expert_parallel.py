"""Token dispatch for routed experts: the seam between a MoE layer and expert parallelism.

A MoE layer owns a dispatcher and hands it its rows sorted by expert:
`dispatcher(experts, x, counts) -> y`, with `x` [T, dim] rows grouped by expert in order,
`counts` int64 [E] (this rank's rows per GLOBAL expert) and `y` [T, dim] in the same row
order. `experts(x, counts_local)` is the grouped-experts module: parameters stacked per
expert on dim 0 ([E, ...]), forward on rows grouped by its (local) experts.

- the MoE layer's own local dispatcher (models/common/moe.py): all experts are here.
- `AllToAllDispatcher` (expert parallel, chosen when the model is parallelized by
  `apply_expert_parallel(moe, ep_mesh)`, which also shards the experts' stacks over the EP
  mesh): route each token copy to the rank that owns its expert, then back. A DeepEP-style
  dispatcher plugs in the same way: any object with this call.

No module's forward is replaced: FSDP (FSDP2's hooks, SimpleFSDP's unit class) wraps the
experts module as any other.

The all-to-all dispatch does, on the EP group of W ranks (E_local = E / W):

1. counts exchange: `counts` viewed as [W, E_local] is "what I send to rank r's expert e".
   One all-to-all of E int64 gives `recv` [W, E_local] = "what rank r sends to my expert e".
   Rows per destination / source rank are the row sums; they become Python split sizes in
   ONE host sync (`.tolist()`), the only one: NCCL/gloo need host-side split sizes.
2. dispatch: `all_to_all_single_autograd(x, out_splits, in_splits)` moves the rows (uneven
   splits, zero allowed); its backward is the reverse all-to-all, so input grads flow home.
3. the received rows are grouped (source rank, local expert); one gather with an index
   permutation built from `recv` by tensor ops (repeat_interleave + cumsums, no Python
   loop) regroups them as (local expert, source rank), which is what the local grouped GEMM
   wants, with local counts `recv.sum(0)`. Local experts may receive 0 rows.
4. the experts module runs on its local experts (weights are DTensors Shard(0) on the EP
   mesh; the experts module uses their local shards).
5. combine: the inverse permutation, then the all-to-all with the splits swapped, returns
   the rows to their sender in the caller's original order.

Weight gradients stay local to the expert owner; averaging them over data-parallel ranks is
FSDP's job, not this module's.

Selective activation checkpointing (SAC): if a region holding the experts is recomputed in
backward, the recompute must not communicate again (extra traffic, and a router recomputed
differently would route rows differently). Observed with torch 2.13 on gloo (see
tests/integration/test_expert_parallel_gloo_ranks.py), an op-level policy sees per experts call, in order:
  counts:   `_c10d_functional.all_to_all_single.default`, `_c10d_functional._wrap_tensor_autograd.default`,
            `_c10d_functional.wait_tensor.default`
  dispatch and combine: the same three ops each.
`all_to_all_single_autograd` is only an alias of `all_to_all_single` in this torch (the op
has its own autograd formula), so no `_c10d_functional_autograd` op shows up (the pinned
torch is the one that matters: none is listed); `.tolist()` shows up as no op at all. The policy is asked in forward only,
after the op ran (`ctx.is_recompute` is never True): the recompute replays its decisions.
MUST_SAVE every op of `SAC_SAVE_OPS` and the recompute reuses the saved counts and rows and
issues no all-to-all (backward's own reverse all-to-alls, one per dispatch/combine, still
run). Under full recompute the counts exchange and dispatch run again in backward (the
combine too unless checkpoint's early stop skips it); both stay correct, just slower.
The op alone does not tell EP's all-to-alls from others; the group name (last positional
argument of `all_to_all_single`) does, if a policy needs to be that precise.

torch.compile (docs/compile.md): the dispatch traces into the block's graph. The `.tolist()`
split sizes become unbacked symbolic sizes (a new routing reuses the graph), the policy above
tags the same ops in the traced graph, and the partitioner keeps them: compiled op SAC sends
no all-to-all in the recompute either (measured: the same backward all-to-alls as eager).
"""

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from torchtitan.distributed.plan import PartPlan, UnitKind

_fc = torch.ops._c10d_functional
SAC_SAVE_OPS = tuple(
    op
    for op in (
        _fc.all_to_all_single.default,
        _fc.all_reduce.default,  # the balance statistics summed over TP (models/common/moe.py)
        _fc.wait_tensor.default,
        getattr(getattr(_fc, "_wrap_tensor_autograd", None), "default", None),
    )
    if op is not None
)


def wait_collective(t: torch.Tensor) -> torch.Tensor:
    # funcol returns an AsyncCollectiveTensor outside tracing; wait through the op (which has
    # an identity autograd formula): `AsyncCollectiveTensor.wait()` would drop the graph
    return funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t


def regroup_index(recv: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Index `idx` with `received[idx]` = the received rows regrouped (local expert, source
    rank); `recv` [W, E_local] holds the row counts in received order (source rank, expert)."""
    w, e_local = recv.shape
    flat = recv.reshape(-1)
    recv_start = torch.cumsum(flat, 0) - flat  # start of each (rank, expert) chunk as received
    sizes_t = recv.t().reshape(-1)  # chunk sizes in target order (expert, rank)
    start_t = torch.cumsum(sizes_t, 0) - sizes_t  # start of each chunk in target order
    src_start_t = recv_start.view(w, e_local).t().reshape(-1)
    chunk = torch.repeat_interleave(
        torch.arange(w * e_local, device=recv.device), sizes_t, output_size=n_rows
    )
    return src_start_t[chunk] + torch.arange(n_rows, device=recv.device) - start_t[chunk]


class AllToAllDispatcher:
    """Expert parallel: rows travel to their expert's owner and back (module docstring).

    Under expert tensor parallel (`replicas` = etp > 1) the group is ep x etp (etp inner) and
    every row goes to each of the etp ranks of its expert's EP rank, which all receive the
    same rows and each computes its slice of the experts' hidden units: the etp copies that
    come back are partial outputs, summed in rank order (no TP collective is added, and the
    copies' gradients add up to the row's). `route` decides the split sizes (step 1); a
    subclass may decide them otherwise (the memory simulation plans them, having no routed
    values)."""

    def __init__(self, ep_mesh: DeviceMesh, num_experts: int, replicas: int = 1):
        self.mesh = ep_mesh
        self.group = ep_mesh.get_group().group_name  # a name: the owner stays deep-copyable
        self.size = ep_mesh.size()  # ranks of the group: ep x etp
        self.replicas = replicas  # etp: copies of each row, one per TP rank of its EP rank
        self.num_experts = num_experts

    def route(self, counts: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, list[int], list[int]]:
        """This rank's rows per global expert -> (`recv` [W, E_local]: the rows each source
        rank sends to each local expert, the rows sent to each rank, the rows received from
        each): one small all-to-all and one host sync."""
        w, t = self.size, self.replicas
        e_local = self.num_experts // (w // t)
        send = counts.view(w // t, 1, e_local).expand(w // t, t, e_local).reshape(-1)
        recv = wait_collective(funcol.all_to_all_single(send, None, None, self.group)).view(
            w, e_local
        )
        splits = torch.cat([send.view(w, e_local).sum(1), recv.sum(1)]).tolist()
        return recv, splits[:w], splits[w:]

    def copies_index(self, counts: torch.Tensor, n_rows: int) -> torch.Tensor:
        """[etp, n_rows]: where copy t of row j sits in the send buffer (rows grouped by
        destination EP rank r, each group sent etp times, once to each of r's TP ranks)."""
        t, ranks = self.replicas, self.size // self.replicas
        per_rank = counts.view(ranks, -1).sum(1)
        start = torch.cumsum(per_rank, 0) - per_rank
        dest = torch.repeat_interleave(
            torch.arange(ranks, device=counts.device), per_rank, output_size=n_rows
        )
        copy = torch.arange(t, device=counts.device).unsqueeze(1)
        rows = torch.arange(n_rows, device=counts.device)
        return (t - 1) * start[dest] + copy * per_rank[dest] + rows

    def __call__(self, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        group = self.group
        if counts.shape != (self.num_experts,):
            raise ValueError(
                f"counts must hold one entry per global expert "
                f"({self.num_experts}), got shape {tuple(counts.shape)}"
            )
        n_in = x.shape[0]
        copies = None
        if self.replicas > 1:  # ETP: one copy of each row per TP rank of its EP rank
            copies = self.copies_index(counts, n_in)
            src = torch.empty_like(copies.view(-1)).scatter(
                0, copies.view(-1), torch.arange(n_in, device=x.device).repeat(self.replicas)
            )
            x = x[src]
        # 1. who sends how many rows to which local expert
        recv, in_splits, out_splits = self.route(counts, x.shape[0])
        n_rows = sum(out_splits)
        # 2. dispatch the rows; 3. regroup them by local expert
        x_recv = funcol.all_to_all_single_autograd(x, out_splits, in_splits, group)
        idx = regroup_index(recv, n_rows)  # built while the rows are in flight
        x_recv = wait_collective(x_recv)
        # 4. the local experts on their rows
        y_local = experts(x_recv[idx], recv.sum(0))
        # 5. undo the regrouping, send the rows home
        # (out of place: a checkpoint region may keep this op's output for backward)
        inv = torch.empty_like(idx).scatter(0, idx, torch.arange(n_rows, device=idx.device))
        y = wait_collective(
            funcol.all_to_all_single_autograd(y_local[inv], in_splits, out_splits, group)
        )
        if copies is None:
            return y
        # ETP: the partial outputs of a row's copies, summed in TP-rank order (deterministic)
        return y[copies].sum(0)


def expert_parallel_from_plan(model: nn.Module, plan: PartPlan, ep_mesh: DeviceMesh) -> None:
    """Expert parallel for every routed-experts unit of a part's plan: the module that holds
    an experts unit (its parent, e.g. the MoE layer) owns its dispatcher."""
    for unit in plan.units:
        if unit.kind is UnitKind.EXPERTS:
            apply_expert_parallel(model.get_submodule(unit.name.rpartition(".")[0]), ep_mesh)


def apply_expert_parallel(moe: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard `moe.experts`' stacked [E, ...] parameters on dim 0 over the 1-D `ep_mesh` (as
    `nn.Parameter(DTensor)`, `Shard(0)`; meta parameters stay on meta) and give `moe` an
    all-to-all dispatcher (module docstring). A 2-D (ep, etp) mesh is expert tensor
    parallel: the stacks are also split over etp on their hidden dim (the experts module's
    `HIDDEN_DIM`: w1 / w3 column-wise, w2 row-wise, as a dense FFN's TP) and the
    all-to-all runs over both dims. Weights are split locally, with no communication: every
    rank must hold the same full weights (or meta ones)."""
    if ep_mesh.ndim not in (1, 2):
        raise ValueError(
            f"expert parallelism needs a 1-D or (ep, etp) mesh, got {ep_mesh.ndim} dims"
        )
    current = getattr(moe, "dispatcher", None)
    if isinstance(current, AllToAllDispatcher):
        if current.mesh is ep_mesh or current.mesh.mesh_dim_names == (
            "_".join(ep_mesh.mesh_dim_names or ()),
        ):
            return  # already applied on this mesh
        raise ValueError("expert parallelism was already applied to this module on another mesh")
    experts = moe.experts
    params = list(experts.named_parameters(recurse=False))
    if not params:
        raise ValueError("the experts module has no parameters to shard")
    w, etp = ep_mesh.size(0), (ep_mesh.size(1) if ep_mesh.ndim == 2 else 1)
    num_experts = params[0][1].shape[0] if params[0][1].ndim else 0
    hidden_dim = getattr(experts, "HIDDEN_DIM", {})
    for name, p in params:
        if isinstance(p, DTensor) or p.ndim == 0 or p.shape[0] != num_experts:
            raise ValueError(
                f"parameter {name!r} ({tuple(p.shape)}) is not a plain [E={num_experts}, ...] stack"
            )
        if etp > 1 and (name not in hidden_dim or p.shape[hidden_dim[name]] % etp):
            raise ValueError(
                f"parameter {name!r} ({tuple(p.shape)}) has no hidden dim (HIDDEN_DIM) divisible"
                f" by the expert tensor parallel degree {etp}"
            )
    if num_experts % w:
        raise ValueError(
            f"{num_experts} experts are not divisible by the expert-parallel degree {w}"
        )
    for name, p in params:
        placements = [Shard(0)] + ([Shard(hidden_dim[name])] if etp > 1 else [])
        dt = distribute_tensor(p.detach(), ep_mesh, placements, src_data_rank=None)
        experts.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))
    # the group of both dims was made with the mesh (ParallelDims.build_mesh): flattening
    # again returns it
    group_mesh = ep_mesh._flatten() if etp > 1 else ep_mesh
    moe.dispatcher = AllToAllDispatcher(group_mesh, num_experts, replicas=etp)
