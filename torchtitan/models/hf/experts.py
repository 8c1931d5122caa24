"""Routed experts in Hugging Face folders, shared by the MoE converters (DeepSeek-V3, Qwen3-MoE).

Published checkpoints and transformers' `save_pretrained` store one tensor per expert and
projection (`<layer>.mlp.experts.{e}.gate_proj.weight`); transformers 5's in-memory layout
fuses them per layer (`<layer>.mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and
`<layer>.mlp.experts.down_proj` [E, H, I]). Our experts are one [E, ...] stack per projection
(w1 = gate, w3 = up, w2 = down). A rank reads only the experts (and rows) it holds, from
either layout.
"""

import re

# Our stack's projection -> the published per-expert projection name.
PROJECTIONS = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.\d+\.(\w+)\.weight$")


def per_expert_names(layer_prefix: str, ours: str, n_experts: int) -> list[str]:
    """`layer_prefix` ("model.layers.3.") + the per-expert names of our projection `ours` (w1/w2/w3)."""
    return [f"{layer_prefix}mlp.experts.{e}.{PROJECTIONS[ours]}.weight" for e in range(n_experts)]


def fused_shapes(
    layer_prefix: str, n_experts: int, dim: int, hidden: int
) -> dict[str, tuple[int, ...]]:
    """transformers 5's fused expert tensors of one MoE layer, with their shapes."""
    p = f"{layer_prefix}mlp.experts."
    return {
        p + "gate_up_proj": (n_experts, 2 * hidden, dim),
        p + "down_proj": (n_experts, dim, hidden),
    }


def prefer_fused(
    shapes: dict, available, layer_prefixes, n_experts: int, dim: int, *, hidden: int
) -> dict:
    """`shapes` (the per-expert layout) with each MoE layer whose fused tensors the folder
    holds (`available` names) switched to the fused layout."""
    for prefix in layer_prefixes:
        fused = fused_shapes(prefix, n_experts, dim, hidden)
        if all(n in available for n in fused):
            experts = f"{prefix}mlp.experts."
            shapes = {
                n: s
                for n, s in shapes.items()
                if not (n.startswith(experts) and n[len(experts) :].split(".")[0].isdigit())
            }
            shapes.update(fused)
    return shapes


def read_stack(reader, names: list[str], hidden: int, index) -> object:
    """This rank's part of an expert stack whose per-expert tensors are `names` (expert
    order): `index` holds, per dim, the global indices it keeps (None: all). Each expert comes
    from its own tensor, or from the layer's fused tensor when the folder has that layout."""
    import torch

    index = list(index) if index is not None else [None, None, None]
    experts = range(len(names)) if index[0] is None else index[0].tolist()
    pieces = []
    for e in experts:
        name = names[e]
        if reader.has(name):
            pieces.append(reader.read(name, index[1:]))
            continue
        prefix, proj = _PER_EXPERT.match(name).groups()
        rows = index[1]
        fused = f"{prefix}.down_proj"
        if proj != "down_proj":  # gate_up_proj: the gate's rows first, then the up projection's
            fused = f"{prefix}.gate_up_proj"
            rows = torch.arange(hidden) if rows is None else rows
            rows = rows + (hidden if proj == "up_proj" else 0)
        pieces.append(reader.read(fused, [torch.tensor([e]), rows, *index[2:]])[0])
    return torch.stack(pieces)
