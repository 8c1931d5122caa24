"""Qwen3's parameters (model.py: QK-norm attention; dense SwiGLU or MoE blocks; a tied output
head), TP as in parallelize.py (q/k norms and the router whole); torch-free (models/shapes.py)."""

from torchtitan.models.qwen3.args import TIED, is_moe_layer
from torchtitan.models.shapes import (
    COLWISE,
    ROWWISE,
    ModelShapes,
    Param,
    block_name,
    decoder_ends,
    linear,
    norm,
    swiglu,
)


def shapes(args) -> ModelShapes:
    hd = args.head_dim

    def block(i: int) -> list[Param]:
        b = block_name(i)
        attention = [
            linear(f"{b}.attention.wq", args.n_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wk", args.n_kv_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wv", args.n_kv_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wo", args.dim, args.n_heads * hd, ROWWISE),
            norm(f"{b}.attention.q_norm", hd),
            norm(f"{b}.attention.k_norm", hd),
        ]
        if is_moe_layer(args, i):
            e, h = args.n_routed_experts, args.moe_inter_dim
            ffn = [
                linear(f"{b}.moe.router.gate", e, args.dim, None),
                Param(f"{b}.moe.experts.w1", (e, h, args.dim), expert=True),
                Param(f"{b}.moe.experts.w2", (e, args.dim, h), expert=True),
                Param(f"{b}.moe.experts.w3", (e, h, args.dim), expert=True),
            ]
        else:
            ffn = swiglu(f"{b}.feed_forward", args.dim, args.ffn_hidden_dim)
        return [
            norm(f"{b}.attention_norm", args.dim),
            *attention,
            norm(f"{b}.ffn_norm", args.dim),
            *ffn,
        ]

    first, last = decoder_ends(args)
    tied = tuple(TIED) if args.tie_word_embeddings else ()
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last, tied)
