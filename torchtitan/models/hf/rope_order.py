"""RoPE feature order between our models and Hugging Face's Llama-family ones.

Our attention rotates adjacent pairs of each head's q/k features (rows 2j, 2j+1 share
frequency j, Meta's layout); Hugging Face's Llama / Qwen rotate halves (rows j and
j + head_dim/2). A converter permutes the rows of wq and wk per head, and anything applied
per head feature before RoPE (Qwen3's q/k norm weights, [head_dim]) the same way.
"""


def pairs_to_halves(tensor, heads: int):
    """Our rows (per head: pairs 2j, 2j+1) -> Hugging Face's (j, j + head_dim/2); a 1-D
    tensor is one head's features."""
    if tensor.dim() == 1:
        return tensor.view(-1, 2).t().reshape(-1)
    rows, cols = tensor.shape
    return tensor.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def halves_to_pairs(tensor, heads: int):
    """Inverse of pairs_to_halves."""
    if tensor.dim() == 1:
        return tensor.view(2, -1).t().reshape(-1)
    rows, cols = tensor.shape
    return tensor.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def read_permuted(reader, name: str, heads: int, index):
    """This rank's part (`index`: per dim the global indices it holds, or None) of a tensor
    stored in Hugging Face's order: read whole (the permutation mixes rows), then indexed."""
    full = halves_to_pairs(reader.read(name), heads)
    for d, ix in enumerate(index or []):
        if ix is not None:
            full = full.index_select(d, ix)
    return full
