"""Llama3 <-> Hugging Face `LlamaForCausalLM` weights: names, RoPE row order, config.json.

Our attention rotates adjacent pairs of each head's q/k features (rows 2j, 2j+1 share
frequency j, Meta's layout); Hugging Face rotates halves (rows j and j + head_dim/2). The
converter permutes the rows of wq and wk per head; every other tensor is only renamed.

Torch-free at import (the config check uses `hf_shapes` and `check_hf_config`); the
tensor functions take and return torch tensors.
"""

import re

from torchtitan.models.hf.rope_order import halves_to_pairs, pairs_to_halves, read_permuted
from torchtitan.models.llama3.args import Llama3Args

# Our name (with {i} for the block index) -> the Hugging Face name.
_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")

# Llama 3.1's RoPE frequency scaling (rope.py), as Hugging Face's config spells it (the factor
# is the flavor's: 8 for 3.1, 32 for 3.2).
ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# A tied model (Llama 3.2 1B / 3B) stores no lm_head: the output reuses the embedding.
TIED_FALLBACK = {"lm_head.weight": "model.embed_tokens.weight"}


def hf_name(fqn: str) -> str:
    """Our (unwrapped) parameter name -> its Hugging Face name."""
    m = _LAYER.match(fqn)
    key, i = (f"layers.{{i}}.{m.group(2)}", m.group(1)) if m else (fqn, "")
    if key not in _NAMES:
        raise KeyError(f"no Hugging Face name for llama3 parameter '{fqn}'")
    return _NAMES[key].format(i=i)


def _heads(fqn: str, args: Llama3Args) -> int:
    """Heads whose rows are permuted (q: n_heads, k: n_kv_heads), 0 for other tensors."""
    if fqn.endswith("attention.wq.weight"):
        return args.n_heads
    if fqn.endswith("attention.wk.weight"):
        return args.n_kv_heads
    return 0


def to_hf(fqn: str, tensor, args: Llama3Args):
    """Our full tensor `fqn` -> Hugging Face layout (pairs (2j, 2j+1) -> rows (j, j + hd/2))."""
    heads = _heads(fqn, args)
    return pairs_to_halves(tensor, heads) if heads else tensor


def from_hf(fqn: str, tensor, args: Llama3Args):
    """Inverse of to_hf: a Hugging Face tensor -> our layout of parameter `fqn`."""
    heads = _heads(fqn, args)
    return halves_to_pairs(tensor, heads) if heads else tensor


def export_tensors(fqn: str, full, args: Llama3Args) -> list[tuple[str, object]]:
    """Our full tensor -> [(its Hugging Face name, the tensor in Hugging Face layout)]."""
    return [(hf_name(fqn), to_hf(fqn, full, args))]


def read_local(fqn: str, args: Llama3Args, reader, index) -> object:
    """This rank's part of `fqn` (`index`: per dim the global indices it holds, or None).
    q/k rows are permuted per head, so those are read whole and then indexed; the others
    read only their rows."""
    if not _heads(fqn, args):
        return reader.read(hf_name(fqn), index)
    return read_permuted(reader, hf_name(fqn), _heads(fqn, args), index)


def hf_shapes(args: Llama3Args) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a model of these args has, with its shape."""
    d, hd, hidden = args.dim, args.head_dim, args.ffn_hidden_dim
    shapes = {
        "model.embed_tokens.weight": (args.vocab_size, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (args.vocab_size, d),
    }
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (args.n_heads * hd, d),
                p + "self_attn.k_proj.weight": (args.n_kv_heads * hd, d),
                p + "self_attn.v_proj.weight": (args.n_kv_heads * hd, d),
                p + "self_attn.o_proj.weight": (d, args.n_heads * hd),
                p + "mlp.gate_proj.weight": (hidden, d),
                p + "mlp.down_proj.weight": (d, hidden),
                p + "mlp.up_proj.weight": (hidden, d),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            }
        )
    return shapes


def hf_config(args: Llama3Args, dtype: str, bos_id: int, eos_id: int) -> dict:
    """config.json of a `LlamaForCausalLM` with these shapes (max_position_embeddings: the
    flavor's context length, not the training seq_len)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": {**ROPE_SCALING, "factor": args.rope_factor} if args.rope_scaling else None,
        "max_position_embeddings": args.max_seq_len,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
    }


def config_mismatches(config: dict, args: Llama3Args) -> list[str]:
    """What in a Hugging Face config.json differs from these args, as 'key=value (ours: ...)'."""
    out = []
    if config.get("model_type", "llama") != "llama":
        out.append(f"model_type={config.get('model_type')!r} (ours: 'llama')")
    expect = {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": config.get("num_key_value_heads") and args.n_kv_heads,
        "intermediate_size": args.ffn_hidden_dim,
        "vocab_size": args.vocab_size,
    }
    for key, ours in expect.items():
        if ours and config.get(key) is not None and config[key] != ours:
            out.append(f"{key}={config[key]} (ours: {ours})")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != args.head_dim:
        out.append(f"head_dim={head_dim} (ours: {args.head_dim})")
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    if theta is not None and float(theta) != args.rope_theta:
        out.append(f"rope_theta={theta} (ours: {args.rope_theta})")
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    ours = {**ROPE_SCALING, "factor": args.rope_factor}
    if args.rope_scaling and (
        kind != "llama3" or any(scaling.get(k) != v for k, v in ours.items() if k != "rope_type")
    ):
        out.append(f"rope scaling {kind!r} {scaling} (ours: {ours})")
    if not args.rope_scaling and kind not in ("default", None):
        out.append(f"rope scaling {kind!r} (ours: none)")
    # Architecture switches our model does not have: loading would drop their tensors.
    for key, ours in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if config.get(key, ours) != ours:
            out.append(f"{key}={config[key]!r} (ours: {ours!r})")
    return out


# Tensors a Hugging Face Llama folder may hold that carry no weights of the model.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
