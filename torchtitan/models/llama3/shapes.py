"""Llama3's parameters (model.py), TP as in parallelize.py; torch-free (models/shapes.py)."""

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
        return [
            norm(f"{b}.attention_norm", args.dim),
            linear(f"{b}.attention.wq", args.n_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wk", args.n_kv_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wv", args.n_kv_heads * hd, args.dim, COLWISE),
            linear(f"{b}.attention.wo", args.dim, args.n_heads * hd, ROWWISE),
            norm(f"{b}.ffn_norm", args.dim),
            *swiglu(f"{b}.feed_forward", args.dim, args.ffn_hidden_dim),
        ]

    first, last = decoder_ends(args)
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last)
