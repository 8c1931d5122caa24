"""AdamW over the model's (possibly sharded) parameters, and the warmup + decay schedule;
optionally stepped inside backward, one parameter at a time (optimizer.early_step_in_backward)."""

from collections import OrderedDict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.utils.hooks import RemovableHandle

from torchtitan.training.lr_schedule import build_lr_scheduler
from torchtitan.training.lr_schedule import lr_factor as lr_factor  # re-exported (importers)
from torchtitan.training.optimizer_list import OptimizerList


def kernels(opt_cfg, device_type: str) -> str:
    """[optimizer] implementation with auto resolved: fused on CUDA, foreach elsewhere."""
    if opt_cfg.implementation != "auto":
        return opt_cfg.implementation
    return "fused" if device_type == "cuda" else "foreach"


def build_optimizer(params, opt_cfg, device_type: str = "cpu") -> torch.optim.Optimizer:
    """optimizer.name's torch class (AdamW: decoupled weight decay; Adam: weight decay added to
    the gradient, as torch.optim.Adam does) with its kernels (`kernels`): fused, foreach, or
    for-loop (one tensor at a time: neither)."""
    impl = kernels(opt_cfg, device_type)
    cls = torch.optim.Adam if opt_cfg.name == "Adam" else torch.optim.AdamW  # (Muon's rest too)
    return cls(
        params,
        lr=opt_cfg.lr,
        betas=(opt_cfg.beta1, opt_cfg.beta2),
        eps=opt_cfg.eps,
        weight_decay=opt_cfg.weight_decay,
        foreach=impl == "foreach",
        fused=impl == "fused",
    )


class PartOptimizers:
    """One AdamW and one LR schedule per model part (pipeline stage).

    Checkpoints are keyed by parameter name through torch's get/set_optimizer_state_dict,
    which maps one model to one optimizer; an optimizer per part keeps that mapping exact
    however the stages are split, so optimizer state loads into any other layout. AdamW is
    elementwise, so splitting it by part changes no number.

    With optimizer.early_step_in_backward each part's entry is an `InBackward` (one AdamW per
    parameter, stepped by the parameter's gradient hook); `step` then only steps the schedules.
    """

    def __init__(self, model_parts, opt_cfg, total_steps: int, lr_cfg, device_type: str = "cpu"):
        # getattr: the unit tests' stand-in configs predate the key
        self.in_backward = bool(getattr(opt_cfg, "early_step_in_backward", False))
        self.muon = str(getattr(opt_cfg, "name", "")).lower() == "muon"
        if self.in_backward:
            self.optimizers = [InBackward(m, opt_cfg, device_type) for m in model_parts]
            each = [o for part in self.optimizers for o in part]
        elif self.muon:  # Muon's matrices, AdamW's rest: two optimizers per part
            from torchtitan.training.muon import MuonAndAdamW

            adamw = lambda params: build_optimizer(params, opt_cfg, device_type)  # noqa: E731
            self.optimizers = [MuonAndAdamW(m, opt_cfg, adamw) for m in model_parts]
            each = [o for part in self.optimizers for o in part]
        else:
            self.optimizers = [
                build_optimizer(list(m.parameters()), opt_cfg, device_type) for m in model_parts
            ]
            each = self.optimizers
        self.schedulers = [build_lr_scheduler(o, total_steps, lr_cfg) for o in each]
        self.pre_hooks: OrderedDict = OrderedDict()
        self.post_hooks: OrderedDict = OrderedDict()

    def register_step_pre_hook(self, hook) -> RemovableHandle:
        """`hook(self, args, kwargs)` before every step, as on a torch optimizer (torchft's
        LocalSGD and DiLoCo hook the step: training/semi_sync.py)."""
        handle = RemovableHandle(self.pre_hooks)
        self.pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook) -> RemovableHandle:
        """`hook(self, args, kwargs)` after every step's update, before the schedules step."""
        handle = RemovableHandle(self.post_hooks)
        self.post_hooks[handle.id] = hook
        return handle

    def step(self) -> None:
        for hook in list(self.pre_hooks.values()):
            hook(self, (), {})
        if not self.in_backward:  # in backward the gradient hooks stepped already
            for o in self.optimizers:
                o.step()
        for hook in list(self.post_hooks.values()):
            hook(self, (), {})
        for s in self.schedulers:
            s.step()

    def grad_norm(self, device: torch.device) -> torch.Tensor:
        """In backward: the global gradient norm the hooks measured before stepping (one
        all-reduce over every rank; PP is refused, so every rank holds one whole stage's
        share), then reset for the next step."""
        sq = sum(
            (part.take_squares(device) for part in self.optimizers), torch.zeros((), device=device)
        )
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sq)
        return sq.sqrt()

    def split_line(self) -> str | None:
        """Muon: how many parameters each optimizer takes on this rank's parts (one line)."""
        if not self.muon:
            return None
        mt = sum(part.tensors[0] for part in self.optimizers)
        at = sum(part.tensors[1] for part in self.optimizers)
        mn = sum(part.counts[0] for part in self.optimizers)
        an = sum(part.counts[1] for part in self.optimizers)
        where = "; ".join(part.where() for part in self.optimizers)
        return (
            f"[torchtitan] optimizer: Muon for {mt} matrices ({mn:,} parameters on this rank),"
            f" AdamW for {at} other tensors ({an:,}); optimizer.muon_params / adamw_params move"
            f" them by name. {where}"
        )

    def last_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]


class InBackward(OptimizerList):
    """One model part's optimizers in backward: an AdamW per trainable parameter, stepped and
    its gradient freed by the parameter's post-accumulate-grad hook (FSDP2 calls it once the
    reduce-scattered shard is in place), so that no rank holds every gradient at once.

    A list of torch optimizers: torch's get/set_optimizer_state_dict take the list for the part
    (states keyed by parameter name, as with one AdamW). `step` steps them all directly (the
    memory simulation's state initialisation); `state` is theirs merged."""

    def __init__(self, model, opt_cfg, device_type: str):
        super().__init__()
        self.squares: list[torch.Tensor] = []  # each stepped gradient's share of the norm^2
        by_param = {}
        for p in model.parameters():
            if p.requires_grad:
                by_param[p] = build_optimizer([p], opt_cfg, device_type)
                self.append(by_param[p])

        def hook(param: torch.Tensor) -> None:
            self.squares.append(_norm_share(param.grad))
            by_param[param].step()
            by_param[param].zero_grad(set_to_none=True)

        for p in by_param:
            p.register_post_accumulate_grad_hook(hook)

    def take_squares(self, device: torch.device) -> torch.Tensor:
        total = sum((s.to(device) for s in self.squares), torch.zeros((), device=device))
        self.squares = []
        return total


@torch.no_grad()
def _norm_share(grad: torch.Tensor) -> torch.Tensor:
    """This rank's share of the squared global norm for one gradient: its local values'
    squares, divided by how many ranks hold the same values (the ranks of the world outside
    its mesh, and the mesh dims it is replicated over), so the sum over all ranks counts
    every value once."""
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    copies = dist.get_world_size() if dist.is_initialized() else 1
    if isinstance(grad, DTensor):
        mesh = grad.device_mesh
        copies //= mesh.size()
        for i, placement in enumerate(grad.placements):
            if isinstance(placement, Replicate):
                copies *= mesh.size(i)
    return local.float().pow(2).sum() / copies
