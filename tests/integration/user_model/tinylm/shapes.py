"""Every parameter, its shape and how TP would split it (torch-free; the model-states check)."""

from torchtitan.models.shapes import ModelShapes, block_name, decoder_ends, norm, swiglu


def shapes(args) -> ModelShapes:
    def block(i: int):
        b = block_name(i)
        return [norm(f"{b}.norm", args.dim), *swiglu(f"{b}.mlp", args.dim, args.hidden)]

    first, last = decoder_ends(args)
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last)
