"""Mixture-of-experts pieces shared by MoE models: SwiGLU FFN, token-choice top-k router with
group-limited routing, grouped experts, and the MoE layer with DeepSeek-V3's load balancing.

Dispatch: every token's k (token, expert) copies are sorted by expert with a stable argsort,
the sorted rows go through ONE call of the layer's dispatcher, `dispatcher(experts, x_sorted,
counts)`: local by default, an all-to-all one once expert parallelism is applied (see
torchtitan/distributed/expert_parallel.py), and the outputs are un-permuted and combined
with the routing weights. Without EP nothing syncs with the host.

Load balancing (DeepSeek-V3 report, section 2.1.2):
- aux-loss-free: a per-expert `expert_bias` is added to the scores for SELECTION only; the
  trainer calls `update_expert_bias` after the optimizer step with the token counts that
  `tokens_per_expert` accumulated (summed over data-parallel ranks first);
- optional auxiliary balance loss (`aux_loss_coeff` > 0), of one of two kinds: DeepSeek-V3's
  sequence-wise loss (`aux_loss_kind="sequence"`: each MoE keeps its last training forward's
  loss in `.aux_loss`, the model's loss is their sum) or the Switch Transformer's (`"switch"`,
  Qwen's: each MoE keeps its routing statistics in `.aux_loss`, and the loss is computed once
  over the statistics of all layers, as transformers' load_balancing_loss_func does); the
  trainer adds `moe_aux_loss(model)` to the loss before backward. Under pipeline parallel the
  Switch statistics travel through the stages (`stage_switch_statistics`); the sequence-wise
  losses of earlier stages never reach the last stage's loss (refused).

torch.compile: a whole MoE block traces as one graph (fullgraph; docs/compile.md). The grouped
GEMM is the opaque `torchtitan::grouped_mm` (grouped_mm.py); the counter and loss writes are
module side effects, which dynamo accepts inside an activation-checkpoint region only with
`torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True` (set by
torchtitan/distributed/compile.py): applied once per forward, never by the recompute, as here.
"""

from typing import Protocol

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.grouped_mm import grouped_mm


class TokenDispatcher(Protocol):
    """How a MoE layer's rows, sorted by expert, reach the experts: `dispatcher(experts, x,
    counts) -> y` with x [T, dim] grouped by expert in order, counts int64 [E] rows per
    global expert, y [T, dim] in the same row order. Expert parallelism
    (distributed/expert_parallel.py) swaps in its all-to-all one."""

    def __call__(
        self, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor: ...


class LocalDispatcher:
    """Every expert is on this rank: the sorted rows go straight to the experts."""

    def __call__(self, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return experts(x, counts)


def _local(w: torch.Tensor) -> torch.Tensor:
    # expert parallelism shards the stacks on dim 0; this rank computes with its own experts
    return w.to_local() if isinstance(w, DTensor) else w


class GroupedExperts(nn.Module):
    """`n_experts` SwiGLU FFNs stored as stacks w1/w3 [E, hidden, dim] and w2 [E, dim, hidden],
    run as grouped GEMMs over rows sorted by expert.

    The GEMMs are `torchtitan::grouped_mm` (grouped_mm.py: `torch._grouped_mm` behind an
    operator with its own fake implementation, so torch.compile and fake-tensor runs trace it
    in float32 as in bfloat16). `torch._grouped_mm` (torch 2.13) needs the contraction
    dimension's stride to be a multiple of 16 bytes, on CPU too: `dim` (w1/w3 forward) and
    `hidden` (w2 forward, and backward) must be multiples of 4 in float32 and of 8 in bfloat16.

    Expert tensor parallel splits each stack on `HIDDEN_DIM` (the hidden units: w1 / w3
    column-wise, w2 row-wise): the outputs are then partial sums over the TP ranks, which
    the dispatcher adds up (distributed/expert_parallel.py).
    """

    HIDDEN_DIM = {"w1": 1, "w2": 2, "w3": 1}

    def __init__(self, dim: int, hidden: int, n_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # standalone use only; models overwrite this through their layout-independent init
        for w in (self.w1, self.w2, self.w3):
            nn.init.trunc_normal_(w, std=0.02, a=-0.06, b=0.06)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [T, dim] with rows grouped by expert in order, counts int64 [E_local] rows per
        (local) expert, sum(counts) == T -> [T, dim] in the same row order."""
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        offs = torch.cumsum(counts, 0).to(torch.int32)  # group ends; stays on device, no sync

        def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return grouped_mm(a, w, offs)

        return mm(F.silu(mm(x, w1)) * mm(x, w3), w2)


def is_expert_stack(fqn: str) -> bool:
    """A model parameter name that is a `GroupedExperts` stack ([E, ...]: `...experts.w1`,
    `w2` or `w3`): what a MoE model counts as routed weights and draws per expert."""
    parts = fqn.split(".")
    return len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in ("w1", "w2", "w3")


class TokenChoiceRouter(nn.Module):
    """Scores tokens against experts (`gate`, float32 sigmoid or softmax) and picks each
    token's top-k experts, optionally limited to its best groups of experts.

    Selection uses scores + expert_bias; the returned weights are the UNBIASED scores of the
    chosen experts (normalised to sum 1 when `route_norm`), times `route_scale`.
    """

    def __init__(
        self,
        dim: int,
        n_experts: int,
        top_k: int,
        n_groups: int = 1,
        n_limited_groups: int = 1,
        *,
        score_func: str = "sigmoid",
        route_norm: bool = True,
        route_scale: float = 1.0,
    ):
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {score_func!r}")
        if n_experts % n_groups:
            raise ValueError(f"{n_experts} experts do not split into {n_groups} groups")
        if not 1 <= n_limited_groups <= n_groups:
            raise ValueError(f"n_limited_groups={n_limited_groups} must be in [1, {n_groups}]")
        if top_k > n_limited_groups * (n_experts // n_groups):
            raise ValueError(f"top_k={top_k} exceeds the experts of {n_limited_groups} group(s)")
        self.n_experts, self.top_k = n_experts, top_k
        self.n_groups, self.n_limited_groups = n_groups, n_limited_groups
        self.score_func, self.route_norm, self.route_scale = score_func, route_norm, route_scale
        # debug.moe_force_load_balance: token copies go to experts round-robin, not by score
        self.round_robin = False
        self.gate = nn.Linear(dim, n_experts, bias=False)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, dim] -> float32 affinities [T, E]."""
        logits = self.gate(x).float()  # float32: near-tied scores must not flip top-k in bf16
        return logits.sigmoid() if self.score_func == "sigmoid" else logits.softmax(dim=-1)

    def select(
        self, scores: torch.Tensor, expert_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """scores [T, E] -> (weights float32 [T, k], expert indices int64 [T, k])."""
        if self.round_robin:  # copy j of the flattened [T, k] goes to expert j mod E
            n = scores.shape[0] * self.top_k
            indices = (torch.arange(n, device=scores.device) % self.n_experts).view(-1, self.top_k)
            return self._weigh(scores, indices), indices
        biased = scores if expert_bias is None else scores + expert_bias
        if self.n_groups > 1:
            grouped = biased.view(scores.shape[0], self.n_groups, -1)
            if self.score_func == "sigmoid":
                # V3: a group's strength is the sum of its 2 best (biased) scores
                group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            else:
                group_score = grouped.amax(dim=-1)
            best = group_score.topk(self.n_limited_groups, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, best, True)
            biased = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(1)
        indices = biased.topk(self.top_k, dim=-1).indices
        return self._weigh(scores, indices), indices

    def _weigh(self, scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        weights = scores.gather(1, indices)  # the bias only chooses; it never weighs
        if self.route_norm:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.route_scale

    def forward(
        self, x: torch.Tensor, expert_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, dim] -> (weights [T, k] float32, indices [T, k] int64, scores [T, E] float32)."""
        scores = self.scores(x)
        weights, indices = self.select(scores, expert_bias)
        return weights, indices, scores


def sequence_balance_loss(
    scores: torch.Tensor,
    indices: torch.Tensor,
    coeff: float,
    token_group: tuple[str, int] | None = None,
) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss, averaged over the batch.

    scores [B, S, E] (router affinities), indices [B, S, k] (chosen experts). Per sequence:
    f_i = E / (k S) * #tokens choosing expert i (no gradient), P_i = mean over tokens of the
    scores normalised to sum 1 per token; loss = coeff * sum_i f_i P_i. `token_group`
    (group name, size): the ranks holding the other chunks of every sequence (TP's sequence
    parallel); the per-sequence sums are added up over them first (`sum_over_group`).
    """
    b, s, e = scores.shape
    k = indices.shape[-1]
    flat = indices.reshape(b, s * k)
    chosen = torch.zeros(b, e, device=scores.device, dtype=scores.dtype).scatter_add(
        1, flat, torch.ones_like(flat, dtype=scores.dtype)
    )
    if token_group is None:
        f = chosen * (e / (k * s))
        p = (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=1)
        return coeff * (f * p).sum(dim=-1).mean()
    s_all = s * token_group[1]
    sums = sum_over_group(
        torch.stack([chosen, (scores / scores.sum(dim=-1, keepdim=True)).sum(dim=1)]),
        token_group[0],
    )
    f = sums[0].detach() * (e / (k * s_all))
    return coeff * (f * (sums[1] / s_all)).sum(dim=-1).mean()


def sum_over_group(t: torch.Tensor, group: str) -> torch.Tensor:
    """`t` summed over the ranks of `group`, the gradient passed through unchanged: every rank
    then computes the same balance loss from the summed statistics, and its gradient reaches
    each rank's own tokens' share (the router's TP-partial gradient is summed over TP by
    DTensor, models/common/tensor_parallel.moe_sharding). Exact in value: the sum plus a zero
    that carries the gradient."""
    total = funcol.all_reduce(t.detach(), "sum", group)
    if isinstance(total, funcol.AsyncCollectiveTensor):
        total = funcol.wait_tensor(total)
    return total + (t - t.detach())


def switch_statistics(scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """One layer's share of the Switch-style loss: [2, E] float32, row 0 the routed copies per
    expert (no gradient), row 1 the sum over tokens of the router probabilities."""
    e = scores.shape[-1]
    flat = indices.reshape(-1)
    counts = torch.zeros(e, device=scores.device, dtype=torch.float32).scatter_add(
        0, flat, torch.ones_like(flat, dtype=torch.float32)
    )
    return torch.stack([counts, scores.float().sum(dim=0)])


def switch_balance_loss(stats: list[torch.Tensor], top_k: int, coeff: float) -> torch.Tensor:
    """The Switch Transformer's balance loss over several layers' `switch_statistics`, as
    Qwen (transformers' load_balancing_loss_func) defines it: with R = rows (tokens x layers),
    f_e = routed copies of expert e / R and P_e = summed probability of e / R,
    loss = coeff * E * sum_e f_e P_e. Only P carries a gradient."""
    total = torch.stack(stats).sum(dim=0)
    counts, probs = total[0].detach(), total[1]
    rows = counts.sum() / top_k
    return coeff * counts.numel() * (counts / rows * (probs / rows)).sum()


def _in_autograd_engine() -> bool:
    """True while autograd's engine runs, i.e. when activation checkpointing (full or
    selective, non-reentrant) recomputes a forward inside backward: such a recompute must
    not count tokens a second time. The graph task id is -1 outside backward."""
    if torch.compiler.is_compiling():
        # dynamo cannot trace the query (non-tensor result). A compiled block (compiled
        # around its AC wrapper, as torchtitan does) writes the counter once per forward:
        # dynamo applies module side effects after the forward graph (with
        # skip_fwd_side_effects_in_bwd_under_checkpoint), and the recompute in backward
        # replays tensor ops only.
        return False
    return torch._C._current_graph_task_id() != -1


class MoE(nn.Module):
    """Routed experts (top-k of `n_experts`) plus optional always-on shared experts.

    Buffers: `expert_bias` float32 [E] (persistent: it is checkpointed) and
    `tokens_per_expert` int64 [E] (not persistent; integers so that sums over ranks are exact
    in any order, hence the same bias update in every layout), which counts routed token copies per
    expert over the training forwards since the last `update_expert_bias`. Eval forwards and
    activation-checkpoint recomputes do not count.
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        n_experts: int,
        top_k: int,
        n_shared_experts: int = 0,
        *,
        n_groups: int = 1,
        n_limited_groups: int = 1,
        score_func: str = "sigmoid",
        route_norm: bool = True,
        route_scale: float = 1.0,
        load_balance_coeff: float = 0.0,
        aux_loss_coeff: float = 0.0,
        aux_loss_kind: str = "sequence",
    ):
        super().__init__()
        if aux_loss_kind not in ("sequence", "switch"):
            raise ValueError(f"aux_loss_kind must be 'sequence' or 'switch', got {aux_loss_kind!r}")
        self.n_experts, self.top_k = n_experts, top_k
        self.load_balance_coeff = load_balance_coeff
        self.aux_loss_coeff, self.aux_loss_kind = aux_loss_coeff, aux_loss_kind
        self.router = TokenChoiceRouter(
            dim,
            n_experts,
            top_k,
            n_groups,
            n_limited_groups,
            score_func=score_func,
            route_norm=route_norm,
            route_scale=route_scale,
        )
        self.experts = GroupedExperts(dim, hidden, n_experts)
        # How sorted rows reach the experts; expert parallelism swaps in its all-to-all one.
        self.dispatcher: TokenDispatcher = LocalDispatcher()
        # False: the dispatch (and the experts) runs outside torch.compile's graph, one graph
        # break: for experts wrapped by FSDP2 / DDP, whose hooks dynamo cannot trace (set by
        # models/common/parallelize.py; docs/compile.md)
        self.dispatch_in_graph = True
        self.shared_experts = (
            FeedForward(dim, hidden * n_shared_experts) if n_shared_experts > 0 else None
        )
        self.register_buffer(
            "expert_bias", torch.zeros(n_experts, dtype=torch.float32), persistent=True
        )
        self.register_buffer(
            "tokens_per_expert", torch.zeros(n_experts, dtype=torch.int64), persistent=False
        )
        self.aux_loss: torch.Tensor | None = None
        # (process-group name, size) of the ranks that split each micro-batch's tokens with
        # this one (TP's sequence parallel; set by the models' TP plans): the balance loss's
        # statistics are summed over them
        self.token_group: tuple[str, int] | None = None

    @property
    def force_load_balance(self) -> bool:
        """debug.moe_force_load_balance: route round-robin (every expert the same load)."""
        return self.router.round_robin

    @force_load_balance.setter
    def force_load_balance(self, on: bool) -> None:
        self.router.round_robin = bool(on)

    @torch.no_grad()
    def _count(self, counts: torch.Tensor) -> None:
        # A new tensor, not an in-place add (see forward); traced by torch.compile as a module
        # attribute write, applied once after the forward graph.
        self.tokens_per_expert = self.tokens_per_expert + counts

    def reset_buffers(self) -> None:
        """Zero the bias and the counter (after `to_empty` they hold garbage)."""
        with torch.no_grad():
            self.expert_bias.zero_()
            self.tokens_per_expert.zero_()
        self.aux_loss = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, S, dim] -> [B, S, dim]."""
        bsz, seq, dim = x.shape
        flat = x.reshape(-1, dim)
        weights, indices, scores = self.router(flat, self.expert_bias)
        n_tok, k = indices.shape
        slot_expert = indices.reshape(-1)  # expert of copy j = (token j // k, slot j % k)
        # rows per expert with a scatter: bincount syncs on CUDA, histc has no int64 on CPU
        # Forward ops stay out of place: a checkpoint region may keep their outputs for backward.
        counts = torch.zeros(self.n_experts, dtype=torch.int64, device=x.device).scatter_add(
            0, slot_expert, torch.ones_like(slot_expert)
        )

        real_forward = self.training and not _in_autograd_engine()
        if real_forward:
            self._count(counts)
        if self.aux_loss_coeff > 0:
            # computed in eval and in a recompute too (kept only from a training forward):
            # checkpointing requires the same ops in the recompute, which may run in another
            # mode than the forward (a pipeline's shape inference runs in eval, its backward not)
            if self.aux_loss_kind == "switch":  # statistics; the loss spans all layers
                aux = switch_statistics(scores, indices)
                if self.token_group is not None:
                    aux = sum_over_group(aux, self.token_group[0])
            else:
                aux = sequence_balance_loss(
                    scores.view(bsz, seq, -1),
                    indices.view(bsz, seq, k),
                    self.aux_loss_coeff,
                    self.token_group,
                )
            if real_forward:
                self.aux_loss = aux

        # stable sort by expert keeps each expert's rows in token order (reproducible)
        order = torch.argsort(slot_expert, stable=True)
        # advanced indexing (not index_select): its backward is index_put with accumulate,
        # which CUDA computes deterministically (sorted), unlike index_add's atomics
        rows = flat[order // k]
        if self.dispatch_in_graph:
            y_sorted = self.dispatcher(self.experts, rows, counts)
        else:
            y_sorted = _dispatch_outside_graph(self.dispatcher, self.experts, rows, counts)
        inverse = torch.empty_like(order).scatter(
            0, order, torch.arange(order.numel(), device=order.device)
        )
        y = y_sorted[inverse].view(n_tok, k, dim)
        # combine the k copies of a token in a fixed order: [T, 1, k] @ [T, k, dim]
        out = torch.bmm(weights.to(y.dtype).unsqueeze(1), y).squeeze(1).view(bsz, seq, dim)
        if self.shared_experts is not None:
            # on the [B, S, dim] input: a TP plan shards/gathers it along the sequence dim
            out = out + self.shared_experts(x)
        return out


@torch._dynamo.disable
def _dispatch_outside_graph(
    dispatcher: TokenDispatcher, experts: nn.Module, x: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """The dispatch run eagerly under torch.compile (MoE.dispatch_in_graph False): the split
    sizes of expert parallel stay on this side of the break, so the graph after it takes no
    routing-dependent integer (which would recompile per routing)."""
    return dispatcher(experts, x, counts)


def moe_modules(model: nn.Module) -> list[MoE]:
    """Every MoE layer of `model` (one pipeline stage holds only its own), in module order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def moe_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """The model's balance loss from the last training forward (None when no layer computed
    one): the sum of the sequence-wise losses, or the Switch loss over every layer's
    statistics. The trainer adds it to the loss before backward."""
    layers = [m for m in moe_modules(model) if m.aux_loss is not None]
    if not layers:
        return None
    switch = [m.aux_loss for m in layers if m.aux_loss_kind == "switch"]
    losses = [m.aux_loss for m in layers if m.aux_loss_kind != "switch"]
    if switch:
        losses.append(switch_balance_loss(switch, layers[0].top_k, layers[0].aux_loss_coeff))
    return torch.stack(losses).sum()


def stage_switch_statistics(
    model: nn.Module, incoming: torch.Tensor | None, n_experts: int, device
) -> torch.Tensor:
    """Under pipeline parallel the Switch loss spans the layers of every stage: each stage
    passes on the running sum of the statistics ([2, E], `switch_statistics`) of the layers
    before it plus its own (those of its last training forward; none in eval), and the last
    stage computes the loss (`switch_balance_loss`). The gradient comes back through the
    pipeline with the hidden state's. The first stage starts from a zero leaf that requires
    grad, so that every stage's output has a gradient to send back."""
    if incoming is None:
        incoming = torch.zeros(2, n_experts, device=device, requires_grad=True)
    if not model.training:
        return incoming
    own = [
        m.aux_loss
        for m in moe_modules(model)
        if m.aux_loss_kind == "switch" and m.aux_loss is not None
    ]
    return (
        torch.stack([incoming, *own]).sum(dim=0) if own else incoming + 0
    )  # a new tensor: stage outputs must be


@torch.no_grad()
def update_expert_bias(moe: MoE, counts_global: torch.Tensor, coeff: float) -> None:
    """Aux-loss-free balancing step (call after the optimizer step): experts with fewer than
    the mean number of tokens get their bias raised by `coeff`, busier ones lowered.

    `counts_global` [E]: tokens per expert summed over every rank that routed tokens through
    this layer since the last update (e.g. `moe.tokens_per_expert` all-reduced over the data-
    parallel ranks). The function zeroes `moe.tokens_per_expert` itself.
    """
    counts = counts_global.to(device=moe.expert_bias.device, dtype=torch.float32)
    moe.expert_bias.add_(coeff * torch.sign(counts.mean() - counts))
    moe.tokens_per_expert = torch.zeros_like(moe.tokens_per_expert)
