"""Parallel degrees -> the one DeviceMesh of the job. Nothing else creates process groups.

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp. Dimensions of size 1
are left out, except dp_shard, which is always there so that data parallelism (and with it
mixed precision) is applied the same way on 1 rank as on many. When both data-parallel
dims exist they are also flattened into "dp" (the ranks that see different data), and
dp_shard x tp into "dp_shard_tp" (one collective for reductions over both).

Context parallel (cp > 1): the cp ranks of one dp coordinate read the same batch and each
keeps its own chunks of every sequence. FSDP shards dense parameters over "dp_shard_cp"
(dp_shard x cp: every rank of it holds different tokens, so gradients are averaged over
it), and losses are averaged over "dp_cp". Attention's K/V gathers run on a process group
of their own with the cp dimension's ranks (`cp_group`): flattening dp_shard (size 1) x cp
returns the cp group object itself, and FSDP's collectives are told apart by their group.

Expert parallel (ep > 1) borrows its ranks from dp_shard, and all of cp and tp first (with
sequence parallel every TP rank routes its own tokens; every CP rank too). dp_shard is then built from two
real dims, dp_shard_mod_ep (what EP leaves) x dp_shard_in_ep (what EP takes), and flattened
back into "dp_shard", so dense parameters shard exactly as without EP. Two more flattened
dims serve the experts: "ep" = dp_shard_in_ep x cp x tp (the all-to-all group; experts are
split over it, never over TP) and the experts' FSDP mesh = dp_replicate x dp_shard_mod_ep.
8 ranks, dp_shard 4, tp 2, ep 4:  dp_shard_mod_ep 2 x dp_shard_in_ep 2 x tp 2.

Expert tensor parallel (etp = tp > 1) splits each expert's matrices over tp instead, so EP
takes only cp's and dp_shard's ranks: "ep" = dp_shard_in_ep x cp (dp_shard_in_ep kept, of
size 1 when EP takes none of dp_shard), the experts' weights live on the 2-D (ep, tp) mesh
and "ep_tp" (ep x tp) is the all-to-all group (a token copy goes to each TP rank of its
expert's EP rank). 4 ranks, dp_shard 2, tp 2, ep 2, etp 2: dp_shard_mod_ep 1 x
dp_shard_in_ep 2 x tp 2.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import Enum

from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan.config.job_config import JobConfig
from torchtitan.distributed.job_shape import Degrees, degrees
from torchtitan.distributed.plan import UnitKind
from torchtitan.distributed.process_groups import group_options

# Slicing by a flattened dim name (dp_shard under EP) is what this module is for; torch 2.13
# warns that a later release will want the flattened mesh kept by hand.
warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")


class MeshDim(str, Enum):
    """Every mesh dimension a job may have. Only this module spells them; everyone else asks
    ParallelDims for a role (the dense / experts data-parallel mesh, the loss group, ...)."""

    PP = "pp"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"  # real, or under EP flattened from the next two
    DP_SHARD_MOD_EP = "dp_shard_mod_ep"  # under EP: what EP leaves of dp_shard (experts' FSDP)
    DP_SHARD_IN_EP = "dp_shard_in_ep"  # under EP: what EP takes of dp_shard
    CP = "cp"  # context parallel: the ranks one sequence is split over
    TP = "tp"
    # flattened
    DP = "dp"  # dp_replicate x dp_shard: the ranks that see different data
    DP_SHARD_TP = "dp_shard_tp"  # one collective over FSDP and TP shards (e.g. the grad norm)
    EP = "ep"  # dp_shard_in_ep x cp x tp (x cp only, under ETP): experts split by index
    EP_TP = "ep_tp"  # under ETP: ep x tp, expert parallel's all-to-all group
    DP_TP = "dp_tp"  # every rank of one pipeline stage
    DP_SHARD_CP = "dp_shard_cp"  # under CP: dense FSDP's shard dim (ranks holding different tokens)
    DP_CP = "dp_cp"  # under CP: every rank whose loss is part of the global mean


@dataclass(frozen=True)
class DataParallelMesh:
    """The ranks one kind of FSDP unit shards and replicates its parameters over."""

    root: DeviceMesh
    dims: tuple[MeshDim, ...]  # outermost first: the replicate dim (HSDP, DDP), then the shard dim
    shard: MeshDim | None  # None: DDP, parameters replicated
    replicate: MeshDim | None  # None: FSDP without replicas
    # Gradients are averaged over every data-parallel rank. Experts under EP shard over fewer
    # ranks (EP took the rest, each EP rank's gradient already sums its group's tokens), so
    # their FSDP must divide by this instead of by its own mesh size.
    divide_factor: int | None = None

    @property
    def mesh(self) -> DeviceMesh:
        """The 1-D mesh, or the 2-D (replicate, shard) mesh of HSDP."""
        return (
            self.root[tuple(d.value for d in self.dims)]
            if len(self.dims) > 1
            else self.root[self.dims[0].value]
        )

    def with_model_dim(self, model_mesh: DeviceMesh) -> DeviceMesh:
        """These dims plus a 1-D model-parallel mesh's dim (TP or EP) of the same root."""
        return self.root[(*(d.value for d in self.dims), *model_mesh.mesh_dim_names)]

    def size(self, dim: MeshDim | None) -> int:
        return self.root[dim.value].size() if dim is not None else 1

    def group_name(self, dim: MeshDim | None) -> str | None:
        return self.root[dim.value].get_group().group_name if dim is not None else None

    def local_rank(self, dim: MeshDim) -> int:
        return self.root[dim.value].get_local_rank()

    @property
    def group_names(self) -> set[str]:
        return {self.group_name(d) for d in self.dims}


@dataclass
class ParallelDims(Degrees):
    """The job's degrees, the one mesh built from them, and the roles the rest of the code
    asks for (a data-parallel mesh per unit kind, the loss group, the TP / EP / PP groups)
    instead of spelling mesh dimensions."""

    _mesh: DeviceMesh | None = field(default=None, repr=False)
    _group_opts: tuple | None = field(default=None, repr=False)
    _cp_group: ProcessGroup | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: JobConfig, world_size: int) -> ParallelDims:
        """Degrees of a config, by the rule the config check applies (job_shape.degrees)."""
        d = degrees(cfg, world_size)
        return cls(d.dp_replicate, d.dp_shard, d.tp, d.pp, d.ep, world_size, d.cp, d.etp)

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The real (not flattened) mesh dims, outermost first."""
        if self.experts_split:
            shard = {
                MeshDim.DP_SHARD_MOD_EP: self.dp_shard // self.ep_from_dp_shard,
                MeshDim.DP_SHARD_IN_EP: self.ep_from_dp_shard,
            }
        else:
            shard = {MeshDim.DP_SHARD: self.dp_shard}
        dims = {
            MeshDim.PP: self.pp,
            MeshDim.DP_REPLICATE: self.dp_replicate,
            **shard,
            MeshDim.CP: self.cp,
            MeshDim.TP: self.tp,
        }
        # dp_shard is always there, so data parallelism (and mixed precision) applies alike on 1 rank
        return {
            k.value: v
            for k, v in dims.items()
            if v > 1 or k.value.startswith(MeshDim.DP_SHARD.value)
        }

    def flattened(self) -> dict[MeshDim, tuple[MeshDim, ...]]:
        """Every flattened dim this job's mesh has -> the real dims it joins, in the order
        build_mesh creates them (each rank creates the same groups in the same order)."""
        shard = (
            (MeshDim.DP_SHARD_MOD_EP, MeshDim.DP_SHARD_IN_EP)
            if self.experts_split
            else (MeshDim.DP_SHARD,)
        )
        cp = (MeshDim.CP,) if self.cp > 1 else ()
        tp = (MeshDim.TP,) if self.tp > 1 else ()
        replicate = (MeshDim.DP_REPLICATE,) if self.dp_replicate > 1 else ()
        out: dict[MeshDim, tuple[MeshDim, ...]] = {}
        if self.etp > 1:  # EP takes cp (when it is > 1, all of it: the check) and dp_shard
            out[MeshDim.DP_SHARD] = shard
            out[MeshDim.EP] = (MeshDim.DP_SHARD_IN_EP, *(cp if self.ep > 1 else ()))
            out[MeshDim.EP_TP] = (*out[MeshDim.EP], MeshDim.TP)
        elif self.ep > 1:
            out[MeshDim.DP_SHARD] = shard
            out[MeshDim.EP] = (MeshDim.DP_SHARD_IN_EP, *cp, *tp)
        if self.dp_replicate > 1:
            out[MeshDim.DP] = (*replicate, *shard)
        if self.cp > 1:
            out[MeshDim.DP_SHARD_CP] = (*shard, MeshDim.CP)
            out[MeshDim.DP_CP] = (*replicate, *shard, MeshDim.CP)
        if (self.dp_shard > 1 or self.cp > 1) and self.tp > 1:
            out[MeshDim.DP_SHARD_TP] = (*shard, *cp, MeshDim.TP)
        return out

    def build_mesh(self, device_type: str, timeout_seconds: int | None = None) -> DeviceMesh:
        shape = self.mesh_shape
        opts = group_options(device_type, timeout_seconds) if timeout_seconds is not None else None
        self._group_opts = opts
        override = {name: opts for name in shape} if opts else None
        mesh = init_device_mesh(
            device_type,
            tuple(shape.values()),
            mesh_dim_names=tuple(shape),
            backend_override=override,
        )
        for name, dims in self.flattened().items():
            mesh[tuple(d.value for d in dims)]._flatten(name.value, backend_override=opts)
        self._mesh = mesh
        self.__dict__["_slices"] = {}
        self._cp_group = self._new_cp_group(mesh, opts) if self.cp > 1 else None
        return mesh

    def _new_cp_group(self, mesh: DeviceMesh, opts) -> ProcessGroup:
        """A process group per cp slice (every rank creates all of them, in one order), apart
        from the mesh's: attention's K/V gathers must not share FSDP's group object."""
        import torch.distributed as dist

        ranks = mesh.mesh.movedim(list(self.mesh_shape).index(MeshDim.CP.value), -1).reshape(
            -1, self.cp
        )
        kw = {"backend": opts[0], "pg_options": opts[1]} if opts else {}
        group, _ = dist.new_subgroups_by_enumeration(
            ranks.tolist(), group_desc="cp_attention", **kw
        )
        return group

    def cp_group(self) -> ProcessGroup | None:
        """Context parallel's own group (attention's K/V gathers); None without CP."""
        return self._cp_group

    def cp_rank(self) -> int:
        return self._slice(MeshDim.CP.value).get_local_rank() if self.cp > 1 else 0

    @property
    def mesh(self) -> DeviceMesh:
        assert self._mesh is not None, "call build_mesh first"
        return self._mesh

    def _slice(self, name: str) -> DeviceMesh:
        """`mesh[name]`, made once: slicing reads the mesh's rank tensor on the host, and the
        trainer asks for its groups at every step."""
        cache = self.__dict__.setdefault("_slices", {})
        if name not in cache:
            cache[name] = self.mesh[name]
        return cache[name]

    def has(self, dim: MeshDim) -> bool:
        """Whether the mesh has this dimension (real or flattened)."""
        return dim.value in self.mesh_shape or dim.value in self.flattened_names()

    def submesh(self, dim: MeshDim) -> DeviceMesh:
        """One dimension of the mesh; KeyError when this job has none (its degree is 1)."""
        dim = MeshDim(dim)  # a mistyped name raises here
        if not self.has(dim):
            raise KeyError(
                f"this job's mesh has no {dim.value!r} dimension (mesh {self.mesh_shape});"
                " its degree is 1: check the degree before asking for it"
            )
        return self._slice(dim.value)

    # ---------------------------------------------------------------- roles

    def dp_mesh(self, kind: UnitKind = UnitKind.DENSE) -> DataParallelMesh:
        """Where units of `kind` shard / replicate: FSDP (dp_shard), HSDP (dp_replicate,
        dp_shard) or DDP (dp_replicate). Routed experts under EP use what EP left of dp_shard."""
        replicate = MeshDim.DP_REPLICATE if self.dp_replicate > 1 else None
        if self.dp_shard == 1 and self.cp == 1 and replicate is not None:  # DDP
            return DataParallelMesh(self.mesh, (replicate,), None, replicate)
        if kind is UnitKind.EXPERTS and self.experts_split:
            shard = MeshDim.DP_SHARD_MOD_EP
            dims = (replicate, shard) if replicate else (shard,)
            return DataParallelMesh(self.mesh, dims, shard, replicate, divide_factor=self.dp_cp)
        shard = MeshDim.DP_SHARD_CP if self.cp > 1 else MeshDim.DP_SHARD
        dims = (replicate, shard) if replicate else (shard,)
        return DataParallelMesh(self.mesh, dims, shard, replicate)

    def fsdp_group_names(self) -> frozenset[str]:
        """Every process group FSDP's own collectives run on (dense units' and experts')."""
        return frozenset(
            self.dp_mesh(UnitKind.DENSE).group_names | self.dp_mesh(UnitKind.EXPERTS).group_names
        )

    def data_mesh(self) -> DeviceMesh:
        """The ranks that read different data (CP ranks read the same batch)."""
        return self._slice(MeshDim.DP.value if self.dp_replicate > 1 else MeshDim.DP_SHARD.value)

    def loss_mesh(self) -> DeviceMesh:
        """The ranks that hold different tokens: losses and batch-level sums are reduced over
        it, and divided by its size (`dp_cp`: every local loss is a mean over equal counts)."""
        return self._slice(MeshDim.DP_CP.value) if self.cp > 1 else self.data_mesh()

    def loss_group(self) -> ProcessGroup:
        return self.loss_mesh().get_group()

    def dp_rank(self) -> int:
        """Which slice of the global batch this rank reads."""
        return self.data_mesh().get_local_rank()

    def tp_mesh(self) -> DeviceMesh | None:
        return self.submesh(MeshDim.TP) if self.tp > 1 else None

    def ep_mesh(self) -> DeviceMesh | None:
        """The mesh routed experts are split over: the 1-D EP mesh, or under ETP the 2-D
        (ep, tp) mesh (ep may be of size 1); None when they are not split."""
        if self.etp > 1:
            cache = self.__dict__.setdefault("_slices", {})
            if "ep+tp" not in cache:
                cache["ep+tp"] = self.mesh[(MeshDim.EP.value, MeshDim.TP.value)]
            return cache["ep+tp"]
        return self.submesh(MeshDim.EP) if self.ep > 1 else None

    def ep_rank(self) -> int:
        """This rank's coordinate on the EP dim (which experts it holds); 0 without EP."""
        return self._slice(MeshDim.EP.value).get_local_rank() if self.ep > 1 else 0

    def pp_group(self) -> ProcessGroup | None:
        return self.submesh(MeshDim.PP).get_group() if self.pp > 1 else None

    def pp_ends_group(self) -> ProcessGroup | None:
        """The first and the last pipeline rank of this rank's pipeline (a tied weight's two
        copies live there); None without PP. Collective on first call: every rank calls it."""
        if self.pp <= 2:
            return self.pp_group()
        if getattr(self, "_pp_ends", None) is None:
            import torch.distributed as dist

            lines = self.mesh.mesh.movedim(
                list(self.mesh_shape).index(MeshDim.PP.value), -1
            ).reshape(-1, self.pp)
            opts = self._group_opts
            kw = {"backend": opts[0], "pg_options": opts[1]} if opts else {}
            group, _ = dist.new_subgroups_by_enumeration(
                [[int(r[0]), int(r[-1])] for r in lines], **kw
            )
            self._pp_ends = (group,)  # cached on every rank (a middle rank's is None): made once
        return self._pp_ends[0]

    def pp_rank(self) -> int:
        return self.submesh(MeshDim.PP).get_local_rank() if self.pp > 1 else 0

    def leads_stage(self) -> bool:
        """Whether this rank is the first of its pipeline stage (coordinate 0 on every other dim)."""
        coords = self.mesh.get_coordinate() or []
        return all(
            c == 0
            for name, c in zip(self.mesh.mesh_dim_names or (), coords)
            if name != MeshDim.PP.value
        )

    def batch_group(self) -> ProcessGroup:
        """The process group of one pipeline stage's ranks (data-parallel and TP): together
        they route the whole global batch through the stage's layers. Made on first use."""
        dims = tuple(d for d in self.mesh_shape if d != MeshDim.PP.value)
        if len(dims) == 1:
            return self._slice(dims[0]).get_group()
        # flattening again returns the same group; it gets the job's collective timeout too
        return (
            self.mesh[dims]
            ._flatten(MeshDim.DP_TP.value, backend_override=self._group_opts)
            .get_group()
        )

    # The order in which named_groups names the groups: a group that two dims share (e.g.
    # dp_shard and ep when EP takes all of dp_shard) is named by the later one.
    _NAMING_ORDER = (
        MeshDim.DP,
        MeshDim.DP_SHARD_TP,
        MeshDim.EP,
        MeshDim.EP_TP,
        MeshDim.DP_SHARD,
        MeshDim.DP_SHARD_CP,
        MeshDim.DP_CP,
    )

    def flattened_names(self) -> tuple[str, ...]:
        """Flattened dims of this mesh, in the order named_groups names collectives by them."""
        built = self.flattened()
        return tuple(d.value for d in self._NAMING_ORDER if d in built)

    def named_groups(self) -> dict[str, str]:
        """Process-group name -> mesh dimension name, flattened dims included (comm stats)."""
        names = mesh_group_dims(self.mesh, self.flattened_names())
        if self._cp_group is not None:  # attention's K/V gathers: "cp"
            names[self._cp_group.group_name] = MeshDim.CP.value
        return names


def mesh_group_dims(mesh: DeviceMesh, extra_names: tuple[str, ...] = ()) -> dict[str, str]:
    """Process-group name -> mesh dimension name, flattened dims included (the world group,
    when there is one, as "world")."""
    import torch.distributed as dist

    out = {}
    for name in list(mesh.mesh_dim_names) + list(extra_names):
        try:
            out[mesh[name].get_group().group_name] = name
        except (KeyError, RuntimeError, ValueError):
            continue
    if dist.is_initialized():
        out.setdefault(dist.group.WORLD.group_name, "world")
    return out
