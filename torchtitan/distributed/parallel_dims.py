"""Parallel degrees -> the one DeviceMesh of the job. Nothing else creates process groups.

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, tp. Dimensions of size 1 are
left out, except dp_shard, which is always there so that data parallelism (and with it
mixed precision) is applied the same way on 1 rank as on many. When both data-parallel
dims exist they are also flattened into "dp" (the ranks that see different data), and
dp_shard x tp into "dp_shard_tp" (one collective for reductions over both).
"""

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan.config.job_config import JobConfig
from torchtitan.config.validate import resolve_dp_shard
from torchtitan.distributed.utils import group_options


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    ep: int
    world_size: int
    _mesh: DeviceMesh | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: JobConfig, world_size: int) -> "ParallelDims":
        p = cfg.parallelism
        return cls(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=resolve_dp_shard(cfg, world_size),
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            world_size=world_size,
        )

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def mesh_shape(self) -> dict[str, int]:
        dims = {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}
        return {k: v for k, v in dims.items() if v > 1 or k == "dp_shard"}

    def build_mesh(self, device_type: str, timeout_seconds: int | None = None) -> DeviceMesh:
        shape = self.mesh_shape
        opts = None
        if timeout_seconds is not None:
            opts = group_options(device_type, timeout_seconds)
        override = {name: opts for name in shape} if opts else None
        mesh = init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape), backend_override=override)
        if self.dp_replicate > 1:
            mesh["dp_replicate", "dp_shard"]._flatten("dp", backend_override=opts)
        if self.dp_shard > 1 and self.tp > 1:
            # Lets DTensor reduce over FSDP and TP shards in one collective (e.g. the grad norm).
            mesh["dp_shard", "tp"]._flatten("dp_shard_tp", backend_override=opts)
        self._mesh = mesh
        return mesh

    @property
    def mesh(self) -> DeviceMesh:
        assert self._mesh is not None, "call build_mesh first"
        return self._mesh

    def submesh(self, name: str) -> DeviceMesh | None:
        """The named mesh dimension, or None when that degree is 1."""
        if name == "dp":
            return self.mesh["dp"] if self.dp_replicate > 1 else self.mesh["dp_shard"]
        if name == "fsdp":  # the 1-D or 2-D (HSDP) mesh FSDP shards / replicates over
            return self.mesh["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else self.mesh["dp_shard"]
        return self.mesh[name] if name in self.mesh_shape else None

    def dp_dims(self) -> list[str]:
        """Mesh dims data parallelism runs over: FSDP, HSDP or DDP."""
        if self.dp_shard == 1 and self.dp_replicate > 1:
            return ["dp_replicate"]
        return ["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else ["dp_shard"]

    def dp_rank(self) -> int:
        return self.submesh("dp").get_local_rank()
