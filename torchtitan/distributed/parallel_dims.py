"""Parallel degrees -> the one DeviceMesh of the job. Nothing else creates process groups.

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, tp. Dimensions of size 1 are
left out, except dp_shard, which is always there so that data parallelism (and with it
mixed precision) is applied the same way on 1 rank as on many. When both data-parallel
dims exist they are also flattened into "dp" (the ranks that see different data), and
dp_shard x tp into "dp_shard_tp" (one collective for reductions over both).

Expert parallel (ep > 1) borrows its ranks from dp_shard, and from tp when tp > 1 (with
sequence parallel every TP rank routes its own tokens). dp_shard is then built from two
real dims, dp_shard_mod_ep (what EP leaves) x dp_shard_in_ep (what EP takes), and flattened
back into "dp_shard", so dense parameters shard exactly as without EP. Two more flattened
dims serve the experts: "ep" = dp_shard_in_ep x tp (the all-to-all group; experts are
split over it, never over TP) and the experts' FSDP mesh = dp_replicate x dp_shard_mod_ep.
8 ranks, dp_shard 4, tp 2, ep 4:  dp_shard_mod_ep 2 x dp_shard_in_ep 2 x tp 2.
"""

import warnings
from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan.distributed.utils import group_options

# Slicing by a flattened dim name (dp_shard under EP) is what this module is for; torch 2.13
# warns that a later release will want the flattened mesh kept by hand.
warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    ep: int
    world_size: int
    _mesh: DeviceMesh | None = field(default=None, repr=False)
    _group_opts: tuple | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg, world_size: int) -> "ParallelDims":
        """Degrees of a validated config (config.validate has checked that they fit)."""
        p = cfg.parallelism
        others = p.data_parallel_replicate_degree * p.tensor_parallel_degree * p.pipeline_parallel_degree
        shard = p.data_parallel_shard_degree if p.data_parallel_shard_degree != -1 else world_size // others
        return cls(
            dp_replicate=p.data_parallel_replicate_degree, dp_shard=shard, tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree, world_size=world_size,
        )

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def ep_from_dp_shard(self) -> int:
        """How many of dp_shard's ranks EP takes (the rest of EP comes from tp)."""
        return self.ep // self.tp if self.ep > 1 else 1

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The real (not flattened) mesh dims, outermost first."""
        if self.ep > 1:
            shard = {"dp_shard_mod_ep": self.dp_shard // self.ep_from_dp_shard, "dp_shard_in_ep": self.ep_from_dp_shard}
        else:
            shard = {"dp_shard": self.dp_shard}
        dims = {"pp": self.pp, "dp_replicate": self.dp_replicate, **shard, "tp": self.tp}
        return {k: v for k, v in dims.items() if v > 1 or k.startswith("dp_shard")}

    def build_mesh(self, device_type: str, timeout_seconds: int | None = None) -> DeviceMesh:
        shape = self.mesh_shape
        opts = group_options(device_type, timeout_seconds) if timeout_seconds is not None else None
        self._group_opts = opts
        override = {name: opts for name in shape} if opts else None
        mesh = init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape), backend_override=override)

        def flatten(dims: tuple[str, ...], name: str) -> None:
            mesh[dims]._flatten(name, backend_override=opts)

        if self.ep > 1:
            flatten(("dp_shard_mod_ep", "dp_shard_in_ep"), "dp_shard")
            flatten(("dp_shard_in_ep", "tp") if self.tp > 1 else ("dp_shard_in_ep",), "ep")
        if self.dp_replicate > 1:
            flatten(("dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep") if self.ep > 1
                    else ("dp_replicate", "dp_shard"), "dp")
        if self.dp_shard > 1 and self.tp > 1:
            # Lets DTensor reduce over FSDP and TP shards in one collective (e.g. the grad norm).
            flatten(("dp_shard_mod_ep", "dp_shard_in_ep", "tp") if self.ep > 1 else ("dp_shard", "tp"), "dp_shard_tp")
        self._mesh = mesh
        return mesh

    @property
    def mesh(self) -> DeviceMesh:
        assert self._mesh is not None, "call build_mesh first"
        return self._mesh

    def submesh(self, name: str) -> DeviceMesh | None:
        """The named mesh dimension (flattened ones included), or None when that degree is 1.

        fsdp: the 1-D or 2-D (HSDP) mesh dense parameters shard / replicate over.
        experts_fsdp: the mesh the experts shard / replicate over (EP took the rest).
        """
        if name == "dp":
            return self.mesh["dp"] if self.dp_replicate > 1 else self.mesh["dp_shard"]
        if name == "fsdp":
            return self.mesh["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else self.mesh["dp_shard"]
        if name == "ep":
            return self.mesh["ep"] if self.ep > 1 else None
        if name == "experts_fsdp":
            if self.ep == 1:
                return self.submesh("fsdp")
            return self.mesh["dp_replicate", "dp_shard_mod_ep"] if self.dp_replicate > 1 else self.mesh["dp_shard_mod_ep"]
        return self.mesh[name] if name in self.mesh_shape else None

    def batch_group(self):
        """The process group of one pipeline stage's ranks (data-parallel and TP): together
        they route the whole global batch through the stage's layers. Made on first use."""
        dims = tuple(d for d in self.mesh_shape if d != "pp")
        if len(dims) == 1:
            return self.mesh[dims[0]].get_group()
        # flattening again returns the same group; it gets the job's collective timeout too
        return self.mesh[dims]._flatten("dp_tp", backend_override=self._group_opts).get_group()

    def dp_dims(self) -> list[str]:
        """Mesh dims data parallelism runs over: FSDP, HSDP or DDP."""
        if self.dp_shard == 1 and self.dp_replicate > 1:
            return ["dp_replicate"]
        return ["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else ["dp_shard"]

    def dp_rank(self) -> int:
        return self.submesh("dp").get_local_rank()

    def flattened_names(self) -> tuple[str, ...]:
        """Flattened dims that comm stats should name (those that exist in this mesh)."""
        return ("dp", "dp_shard_tp", "ep") + (("dp_shard",) if self.ep > 1 else ())
