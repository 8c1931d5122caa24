"""Qwen3 <-> Hugging Face `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` weights: names, RoPE row
order, experts, tied embeddings, config.json.

- RoPE: Hugging Face rotates halves, we rotate adjacent pairs: wq / wk rows are permuted per
  head, and the q/k norm weights (one head's features) the same way (models/hf/rope_order.py).
- Experts: one tensor per expert as published, or transformers 5's fused layout
  (models/hf/experts.py); each rank reads only the experts it holds.
- Tied embeddings (0.6B / 1.7B / 4B): the hub stores `model.embed_tokens.weight` only; we
  write it once the same way, and a pipeline's last stage reads its copy of the output head
  from it.

Torch-free at import (the config check uses hf_shapes and config_mismatches).
"""

import re

from torchtitan.models.hf.experts import per_expert_names, prefer_fused, read_stack
from torchtitan.models.hf.rope_order import pairs_to_halves, read_permuted
from torchtitan.models.qwen3.args import Qwen3Args, is_moe_layer

_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "moe.router.gate.weight": "mlp.gate.weight",
}
_EXPERTS = {"moe.experts.w1": "w1", "moe.experts.w2": "w2", "moe.experts.w3": "w3"}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")

# A tied model stores no lm_head: the output head reads the embedding.
TIED_FALLBACK = {"lm_head.weight": "model.embed_tokens.weight"}
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def _tied(fqn: str, args: Qwen3Args) -> bool:
    return args.tie_word_embeddings and fqn == "output.weight"


def hf_names(fqn: str, args: Qwen3Args) -> list[str]:
    """The Hugging Face tensors our parameter `fqn` is made of: one, or one per expert."""
    if _tied(fqn, args):
        return [TIED_FALLBACK["lm_head.weight"]]
    m = _LAYER.match(fqn)
    if not m:
        if fqn not in _TOP:
            raise KeyError(f"no Hugging Face name for qwen3 parameter '{fqn}'")
        return [_TOP[fqn]]
    layer, rest = m.group(1), m.group(2)
    if rest in _EXPERTS:
        return per_expert_names(f"model.layers.{layer}.", _EXPERTS[rest], args.n_routed_experts)
    if rest not in _BLOCK:
        raise KeyError(f"no Hugging Face name for qwen3 parameter '{fqn}'")
    return [f"model.layers.{layer}.{_BLOCK[rest]}"]


def _heads(fqn: str, args: Qwen3Args) -> int:
    """Heads whose rows are permuted (q: n_heads, k: n_kv_heads; the q/k norms: one head's
    features), 0 for other tensors."""
    if fqn.endswith("attention.wq.weight"):
        return args.n_heads
    if fqn.endswith("attention.wk.weight"):
        return args.n_kv_heads
    return 1 if fqn.endswith(("attention.q_norm.weight", "attention.k_norm.weight")) else 0


def export_tensors(fqn: str, full, args: Qwen3Args) -> list[tuple[str, object]]:
    """Our full tensor -> (Hugging Face name, tensor) pairs; a tied copy is not written (the
    embedding is, once)."""
    if _tied(fqn, args):
        return []
    if fqn.endswith(
        "moe.expert_bias"
    ):  # our bias-based balancing: Qwen3's routers have no such bias
        if bool(full.any()):
            raise ValueError(
                f"'{fqn}' holds a trained routing bias (--moe.load_balance_coeff > 0), which"
                " Qwen3MoeForCausalLM cannot express: the export would route differently"
            )
        return []
    names = hf_names(fqn, args)
    if fqn.split(".", 2)[-1] in _EXPERTS or any(fqn.endswith(k) for k in _EXPERTS):
        return [(name, full[e]) for e, name in enumerate(names)]
    heads = _heads(fqn, args)
    return [(names[0], pairs_to_halves(full, heads) if heads else full)]


def export_refusal(args: Qwen3Args) -> str | None:
    """Why a run of these args cannot be exported (None: it can): Qwen3's routers have no
    selection bias, so a model balanced by one would route differently in transformers."""
    if args.moe is not None and args.load_balance_coeff > 0:
        return (
            f"--moe.load_balance_coeff={args.load_balance_coeff:g} trains a routing bias that"
            " Qwen3MoeForCausalLM cannot hold; balance with --moe.aux_loss_coeff only (set"
            " --moe.load_balance_coeff=0) or export the checkpoint without it"
        )
    return None


def read_local(fqn: str, args: Qwen3Args, reader, index) -> object:
    """This rank's part of parameter `fqn` (`index`: per dim the global indices it holds)."""
    names = hf_names(fqn, args)
    if len(names) > 1 or any(fqn.endswith(k) for k in _EXPERTS):
        return read_stack(reader, names, args.moe_inter_dim, index)
    heads = _heads(fqn, args)
    if heads:
        return read_permuted(reader, names[0], heads, index)
    return reader.read(names[0], index)


def hf_shapes(args: Qwen3Args) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a model of these args has (the published layout)."""
    d, hd, e = args.dim, args.head_dim, args.n_routed_experts
    shapes = {"model.embed_tokens.weight": (args.vocab_size, d), "model.norm.weight": (d,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, d)
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (args.n_heads * hd, d),
                p + "self_attn.k_proj.weight": (args.n_kv_heads * hd, d),
                p + "self_attn.v_proj.weight": (args.n_kv_heads * hd, d),
                p + "self_attn.o_proj.weight": (d, args.n_heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
            }
        )
        if is_moe_layer(args, i):
            shapes[p + "mlp.gate.weight"] = (e, d)
            for x in range(e):
                q = f"{p}mlp.experts.{x}."
                h = args.moe_inter_dim
                shapes.update(
                    {
                        q + "gate_proj.weight": (h, d),
                        q + "up_proj.weight": (h, d),
                        q + "down_proj.weight": (d, h),
                    }
                )
        else:
            f = args.ffn_hidden_dim
            shapes.update(
                {
                    p + "mlp.gate_proj.weight": (f, d),
                    p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f),
                }
            )
    return shapes


def required(args: Qwen3Args, available) -> dict[str, tuple[int, ...]]:
    """hf_shapes, with each MoE layer's experts fused where the folder has transformers 5's layout."""
    layers = [f"model.layers.{i}." for i in range(args.n_layers) if is_moe_layer(args, i)]
    return prefer_fused(
        hf_shapes(args),
        available,
        layers,
        args.n_routed_experts,
        args.dim,
        hidden=args.moe_inter_dim,
    )


def unread(args: Qwen3Args) -> re.Pattern:
    """Stored but not read: a tied checkpoint's lm_head, when one was written anyway."""
    return re.compile(r"^lm_head\.weight$" if args.tie_word_embeddings else r"(?!)")


def hf_config(args: Qwen3Args, dtype: str, bos_id: int, eos_id: int) -> dict:
    """config.json of a `Qwen3ForCausalLM` (dense) or `Qwen3MoeForCausalLM` with these shapes."""
    config = {
        "architectures": ["Qwen3MoeForCausalLM" if args.moe is not None else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if args.moe is not None else "qwen3",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": args.max_seq_len,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": args.tie_word_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
    }
    if args.moe is not None:
        config.update(
            {
                "num_experts": args.n_routed_experts,
                "num_experts_per_tok": args.n_activated_experts,
                "moe_intermediate_size": args.moe_inter_dim,
                "decoder_sparse_step": args.decoder_sparse_step,
                "mlp_only_layers": list(args.mlp_only_layers),
                "norm_topk_prob": args.route_norm,
                "router_aux_loss_coef": args.aux_loss_coeff,
                "output_router_logits": False,
            }
        )
    return config


def config_mismatches(config: dict, args: Qwen3Args) -> list[str]:
    """What in a Hugging Face config.json differs from these args, as 'key=value (ours: ...)'."""
    out = []
    kind = "qwen3_moe" if args.moe is not None else "qwen3"
    if config.get("model_type", kind) != kind:
        out.append(f"model_type={config.get('model_type')!r} (ours: {kind!r})")
    expect = {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "tie_word_embeddings": args.tie_word_embeddings,
    }
    if args.moe is not None:
        expect.update(
            {
                "num_experts": args.n_routed_experts,
                "num_experts_per_tok": args.n_activated_experts,
                "moe_intermediate_size": args.moe_inter_dim,
                "decoder_sparse_step": args.decoder_sparse_step,
                "norm_topk_prob": args.route_norm,
            }
        )
        if any(not is_moe_layer(args, i) for i in range(args.n_layers)):
            expect["intermediate_size"] = args.ffn_hidden_dim
    else:
        expect["intermediate_size"] = args.ffn_hidden_dim
    for key, ours in expect.items():
        if config.get(key) is not None and config[key] != ours:
            out.append(f"{key}={config[key]!r} (ours: {ours!r})")
    if args.moe is not None and list(config.get("mlp_only_layers") or []) != list(
        args.mlp_only_layers
    ):
        out.append(
            f"mlp_only_layers={config.get('mlp_only_layers')} (ours: {list(args.mlp_only_layers)})"
        )
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    if theta is not None and float(theta) != args.rope_theta:
        out.append(f"rope_theta={theta} (ours: {args.rope_theta})")
    scaling = config.get("rope_scaling") or params
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type not in ("default", None):
        out.append(f"rope scaling {rope_type!r} (ours: none)")
    eps = config.get("rms_norm_eps")
    if eps is not None and float(eps) != args.norm_eps:
        out.append(f"rms_norm_eps={eps} (ours: {args.norm_eps})")
    for key, ours in (
        ("attention_bias", False),
        ("hidden_act", "silu"),
        ("use_sliding_window", False),
    ):
        if config.get(key, ours) != ours:
            out.append(f"{key}={config[key]!r} (ours: {ours!r})")
    return out
