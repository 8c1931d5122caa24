"""DeepSeek-V3 <-> Hugging Face `DeepseekV3ForCausalLM` weights: names, experts, config.json.

The published checkpoints (DeepSeek-V3/R1, Moonlight) and transformers' `save_pretrained`
store one tensor per routed expert (`mlp.experts.{e}.gate_proj.weight`); our experts are one
[E, ...] stack per projection, so a stack is E tensors, and each rank reads only the experts
(and rows) it holds. transformers 5's in-memory layout fuses them (`mlp.experts.gate_up_proj`
[E, 2I, H], `mlp.experts.down_proj` [E, H, I]); a folder in that layout is read too. Exports
write the published layout, which both the published tooling and `from_pretrained` read.

RoPE needs no permutation: the published q/k RoPE rows rotate adjacent pairs, as ours do
(transformers' `rope_interleave=True`). The multi-token-prediction module `mtp.{k}` is the
published layer `n_layers + k`, whose `embed_tokens` and `shared_head.head` are copies of the
model's embedding and output head (ours shares them: exported as copies, not read back).

Torch-free at import (the config check uses hf_shapes and config_mismatches).
"""

import re

from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, yarn_on
from torchtitan.models.hf.experts import per_expert_names, prefer_fused, read_stack

# Our name inside a block (layers.{i}. or mtp.{k}.block.) -> the Hugging Face name inside a layer.
_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "moe.router.gate.weight": "mlp.gate.weight",
    "moe.expert_bias": "mlp.gate.e_score_correction_bias",
    "moe.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "moe.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
# Routed-expert stacks: our name inside a block -> the projection (models/hf/experts.py).
_EXPERT = {"moe.experts.w1": "w1", "moe.experts.w2": "w2", "moe.experts.w3": "w3"}
# The multi-token-prediction module's own tensors (besides its block).
_MTP = {
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "norm.weight": "shared_head.norm.weight",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_MTP_NAME = re.compile(r"^mtp\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

# Persistent buffers that are weights of the checkpoint (read and written with the parameters).
BUFFERS = re.compile(r"(^|\.)moe\.expert_bias$")
# A Hugging Face model with tied embeddings does not exist for DeepSeek-V3.
TIED_FALLBACK: dict[str, str] = {}
# Stored tensors that carry no weights of the model.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def _mtp(args: DeepSeekV3Args) -> int:
    return args.mtp_depth


def _block_hf(rest: str, layer: int) -> str:
    if rest not in _BLOCK:
        raise KeyError(rest)
    return f"model.layers.{layer}.{_BLOCK[rest]}"


def hf_names(fqn: str, args: DeepSeekV3Args) -> list[str]:
    """The Hugging Face tensors our parameter (or checkpointed buffer) `fqn` is made of: one,
    or one per expert for a routed-expert stack (in expert order)."""
    layer, rest = None, fqn
    m = _LAYER.match(fqn)
    if m:
        layer, rest = int(m.group(1)), m.group(2)
    m = _MTP_NAME.match(fqn)
    if m:
        layer = args.n_layers + int(m.group(1))
        rest = m.group(2)
        if rest in _MTP:
            return [f"model.layers.{layer}.{_MTP[rest]}"]
        if not rest.startswith("block."):
            raise KeyError(f"no Hugging Face name for deepseek_v3 parameter '{fqn}'")
        rest = rest[len("block.") :]
    if layer is None:
        if fqn not in _TOP:
            raise KeyError(f"no Hugging Face name for deepseek_v3 parameter '{fqn}'")
        return [_TOP[fqn]]
    if rest in _EXPERT:
        return per_expert_names(f"model.layers.{layer}.", _EXPERT[rest], args.n_routed_experts)
    try:
        return [_block_hf(rest, layer)]
    except KeyError:
        raise KeyError(f"no Hugging Face name for deepseek_v3 parameter '{fqn}'") from None


def export_tensors(fqn: str, full, args: DeepSeekV3Args) -> list[tuple[str, object]]:
    """Our full tensor -> (Hugging Face name, tensor) pairs (an expert stack: one per expert)."""
    names = hf_names(fqn, args)
    if len(names) == 1 and not _is_stack(fqn):
        return [(names[0], full)]
    return [(name, full[e]) for e, name in enumerate(names)]


def _is_stack(fqn: str) -> bool:
    return any(fqn.endswith(k) for k in _EXPERT)


def mtp_copies(args: DeepSeekV3Args, tensors: dict) -> list[tuple[str, object]]:
    """The published MTP layers' copies of the shared embedding and output head, of those in
    `tensors` (under PP the first stage's writer holds the embedding, the last one the head)."""
    out = []
    for k in range(_mtp(args)):
        layer = args.n_layers + k
        for ours, theirs in (
            ("tok_embeddings.weight", "embed_tokens.weight"),
            ("output.weight", "shared_head.head.weight"),
        ):
            if ours in tensors:  # a clone: safetensors refuses to write tensors that share memory
                out.append((f"model.layers.{layer}.{theirs}", tensors[ours].clone()))
    return out


def export_args(args: DeepSeekV3Args, max_positions: int) -> DeepSeekV3Args:
    """The run's args for an export: the YaRN rule resolved at the training length (what the
    trained model computed), max_seq_len = the flavor's context (max_position_embeddings)."""
    import dataclasses

    return dataclasses.replace(
        args, yarn="always" if yarn_on(args) else "never", max_seq_len=max_positions
    )


# Resolved fields a checkpoint marker records for a later offline export (scripts/convert_hf.py).
EXPORT_FIELDS = ("yarn", "yarn_temperature", "mtp_depth")
# Rules a model keeps from where it came from (a Hugging Face folder): a checkpoint marker
# records them unresolved, and a run started from that checkpoint adopts them.
RULE_FIELDS = ("yarn", "yarn_temperature")


def read_local(fqn: str, args: DeepSeekV3Args, reader, index) -> object:
    """This rank's part of parameter `fqn`: `index` holds, per dim, the global indices it
    keeps (models.common.init.local_indices). Reads only those experts and rows."""
    names = hf_names(fqn, args)
    if not _is_stack(fqn):
        return reader.read(names[0], index)
    return read_stack(reader, names, args.moe_inter_dim, index)


def hf_shapes(args: DeepSeekV3Args, mtp: bool = True) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a model of these args has (the published layout), with its
    shape; `mtp`: with the MTP layers (and their embedding / head copies)."""
    d, e = args.dim, args.n_routed_experts
    heads, qk, v = args.n_heads, args.qk_head_dim, args.v_head_dim
    shapes = {
        "model.embed_tokens.weight": (args.vocab_size, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (args.vocab_size, d),
    }

    def layer(i: int) -> None:
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.kv_a_proj_with_mqa.weight": (
                    args.kv_lora_rank + args.qk_rope_head_dim,
                    d,
                ),
                p + "self_attn.kv_a_layernorm.weight": (args.kv_lora_rank,),
                p + "self_attn.kv_b_proj.weight": (
                    heads * (args.qk_nope_head_dim + v),
                    args.kv_lora_rank,
                ),
                p + "self_attn.o_proj.weight": (d, heads * v),
            }
        )
        if args.q_lora_rank:
            shapes.update(
                {
                    p + "self_attn.q_a_proj.weight": (args.q_lora_rank, d),
                    p + "self_attn.q_a_layernorm.weight": (args.q_lora_rank,),
                    p + "self_attn.q_b_proj.weight": (heads * qk, args.q_lora_rank),
                }
            )
        else:
            shapes[p + "self_attn.q_proj.weight"] = (heads * qk, d)
        if i < args.n_dense_layers:
            shapes.update(
                {
                    p + "mlp.gate_proj.weight": (args.inter_dim, d),
                    p + "mlp.up_proj.weight": (args.inter_dim, d),
                    p + "mlp.down_proj.weight": (d, args.inter_dim),
                }
            )
            return
        hidden = args.moe_inter_dim
        shapes.update({p + "mlp.gate.weight": (e, d), p + "mlp.gate.e_score_correction_bias": (e,)})
        for x in range(e):
            q = f"{p}mlp.experts.{x}."
            shapes.update(
                {
                    q + "gate_proj.weight": (hidden, d),
                    q + "up_proj.weight": (hidden, d),
                    q + "down_proj.weight": (d, hidden),
                }
            )
        if args.n_shared_experts:
            shared = hidden * args.n_shared_experts
            shapes.update(
                {
                    p + "mlp.shared_experts.gate_proj.weight": (shared, d),
                    p + "mlp.shared_experts.up_proj.weight": (shared, d),
                    p + "mlp.shared_experts.down_proj.weight": (d, shared),
                }
            )

    for i in range(args.n_layers):
        layer(i)
    for k in range(_mtp(args) if mtp else 0):
        i = args.n_layers + k
        layer(i)
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "enorm.weight": (d,),
                p + "hnorm.weight": (d,),
                p + "eh_proj.weight": (d, 2 * d),
                p + "shared_head.norm.weight": (d,),
                p + "embed_tokens.weight": (args.vocab_size, d),
                p + "shared_head.head.weight": (args.vocab_size, d),
            }
        )
    return shapes


def required(args: DeepSeekV3Args, available) -> dict[str, tuple[int, ...]]:
    """The tensors a folder holding `available` names must have for these args (each MoE
    layer's experts per expert, or fused where the folder has transformers 5's fused layout);
    MTP layers only with mtp_depth > 0."""
    layers = [f"model.layers.{i}." for i in range(args.n_dense_layers, args.n_layers + _mtp(args))]
    shapes = prefer_fused(
        hf_shapes(args),
        available,
        layers,
        args.n_routed_experts,
        args.dim,
        hidden=args.moe_inter_dim,
    )
    # The MTP layers' embedding / head copies are written, never read (ours are shared).
    copies = unread(args)
    return {n: s for n, s in shapes.items() if not copies.search(n)}


def unread(args: DeepSeekV3Args) -> re.Pattern:
    """Stored names that are expected but not read: the MTP copies of the embedding / head."""
    layers = "|".join(str(args.n_layers + k) for k in range(_mtp(args))) or "-1"
    return re.compile(rf"^model\.layers\.({layers})\.(embed_tokens|shared_head\.head)\.weight$")


def skipped_layers(names, args: DeepSeekV3Args) -> list[int]:
    """Layer indices >= n_layers + mtp_depth found in `names` (MTP layers the run leaves out)."""
    found = set()
    for n in names:
        m = _HF_LAYER.match(n)
        if m and int(m.group(1)) >= args.n_layers + _mtp(args):
            found.add(int(m.group(1)))
    return sorted(found)


def skip_note(names, args: DeepSeekV3Args, config: dict) -> str | None:
    """One line when the folder holds multi-token-prediction layers the run does not use."""
    extra = skipped_layers(names, args)
    mtp = int(config.get("num_nextn_predict_layers", 0) or 0)
    if extra and mtp and extra == list(range(args.n_layers + _mtp(args), args.n_layers + mtp)):
        return (
            f"skipping the folder's multi-token-prediction layer(s) {', '.join(map(str, extra))}"
            f" (--model.mtp_depth={_mtp(args)}; set it to {mtp} to train them)"
        )
    return None


def is_skipped(name: str, args: DeepSeekV3Args, config: dict) -> bool:
    m = _HF_LAYER.match(name)
    mtp = int(config.get("num_nextn_predict_layers", 0) or 0)
    return bool(m) and args.n_layers + _mtp(args) <= int(m.group(1)) < args.n_layers + mtp


def _topk_method(args: DeepSeekV3Args) -> str:
    if args.load_balance_coeff > 0 or args.score_func == "sigmoid":
        return "noaux_tc"  # bias-corrected selection (V3)
    return "group_limited_greedy" if args.n_expert_groups > 1 else "greedy"


def rope_scaling(args: DeepSeekV3Args) -> dict | None:
    """The config's YaRN entry when a model of these args (at their max_seq_len) uses YaRN."""
    if not yarn_on(args):
        return None
    out = {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": args.rope_factor,
        "original_max_position_embeddings": args.original_seq_len,
        "beta_fast": args.beta_fast,
        "beta_slow": args.beta_slow,
    }
    if (
        args.yarn_temperature == "softmax"
    ):  # the temperature on the softmax: both coefficients equal
        out.update({"mscale": args.mscale, "mscale_all_dim": args.mscale})
    return out


def hf_config(
    args: DeepSeekV3Args, dtype: str, bos_id: int, eos_id: int, max_positions: int = 0
) -> dict:
    """config.json of a `DeepseekV3ForCausalLM` computing what a model of `args` computes at
    its max_seq_len (the YaRN rule resolved there); max_position_embeddings: `max_positions`
    (the flavor's context length) or max_seq_len."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.inter_dim,
        "moe_intermediate_size": args.moe_inter_dim,
        "num_hidden_layers": args.n_layers,
        "num_nextn_predict_layers": _mtp(args),
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_heads,
        "n_shared_experts": args.n_shared_experts,
        "n_routed_experts": args.n_routed_experts,
        "routed_scaling_factor": args.route_scale,
        "kv_lora_rank": args.kv_lora_rank,
        "q_lora_rank": args.q_lora_rank or None,
        "qk_rope_head_dim": args.qk_rope_head_dim,
        "v_head_dim": args.v_head_dim,
        "qk_nope_head_dim": args.qk_nope_head_dim,
        "topk_method": _topk_method(args),
        "n_group": args.n_expert_groups,
        "topk_group": args.n_limited_groups,
        "num_experts_per_tok": args.n_activated_experts,
        "moe_layer_freq": 1,
        "first_k_dense_replace": args.n_dense_layers,
        "norm_topk_prob": args.route_norm,
        "scoring_func": args.score_func,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions or args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling(args),
        "rope_interleave": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
    }


def _rope(config: dict) -> tuple[dict, float | None]:
    """(the YaRN / rope entry, rope_theta) in either spelling: published rope_scaling +
    rope_theta, or transformers 5's rope_parameters."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    entry = scaling or ({k: v for k, v in params.items() if k != "rope_theta"} if params else {})
    theta = config.get("rope_theta", params.get("rope_theta"))
    return entry, theta


def rope_kind(config: dict) -> str:
    entry, _ = _rope(config)
    return str(entry.get("rope_type", entry.get("type", "default")) or "default")


def rules_from_config(config: dict) -> dict:
    """The folder's YaRN rule as args fields: "always" for a yarn folder (transformers applies
    it at every length), "never" otherwise; the temperature on the RoPE rows when the folder
    has no mscale_all_dim. Shapes stay the flavor's (config_mismatches checks them)."""
    entry, _ = _rope(config)
    if rope_kind(config) != "yarn":
        return {"yarn": "never"}
    return {
        "yarn": "always",
        "yarn_temperature": "softmax" if entry.get("mscale_all_dim") else "rope",
    }


def config_mismatches(config: dict, args: DeepSeekV3Args) -> list[str]:
    """What in a Hugging Face config.json differs from these args (or cannot be expressed by
    our model), as 'key=value (ours: ...)'."""
    out = []
    if config.get("model_type", "deepseek_v3") not in ("deepseek_v3", "deepseek_v2", "kimi_k2"):
        out.append(f"model_type={config.get('model_type')!r} (ours: 'deepseek_v3')")
    q_lora = config.get("q_lora_rank")
    expect = {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "intermediate_size": args.inter_dim,
        "moe_intermediate_size": args.moe_inter_dim,
        "vocab_size": args.vocab_size,
        "n_routed_experts": args.n_routed_experts,
        "n_shared_experts": args.n_shared_experts,
        "num_experts_per_tok": args.n_activated_experts,
        "first_k_dense_replace": args.n_dense_layers,
        "kv_lora_rank": args.kv_lora_rank,
        "qk_nope_head_dim": args.qk_nope_head_dim,
        "qk_rope_head_dim": args.qk_rope_head_dim,
        "v_head_dim": args.v_head_dim,
        "n_group": args.n_expert_groups,
        "topk_group": args.n_limited_groups,
        "norm_topk_prob": args.route_norm,
        "scoring_func": args.score_func,
    }
    for key, ours in expect.items():
        if config.get(key) is not None and config[key] != ours:
            out.append(f"{key}={config[key]!r} (ours: {ours!r})")
    if (q_lora or 0) != args.q_lora_rank:
        out.append(f"q_lora_rank={q_lora!r} (ours: {args.q_lora_rank or None!r})")
    if config.get("num_key_value_heads") not in (None, args.n_heads):
        out.append(f"num_key_value_heads={config['num_key_value_heads']} (ours: {args.n_heads})")
    scale = config.get("routed_scaling_factor")
    if scale is not None and float(scale) != args.route_scale:
        out.append(f"routed_scaling_factor={scale} (ours: {args.route_scale})")
    eps = config.get("rms_norm_eps")
    if eps is not None and float(eps) != args.norm_eps:
        out.append(f"rms_norm_eps={eps} (ours: {args.norm_eps})")
    folder_mtp = int(config.get("num_nextn_predict_layers", 0) or 0)
    if _mtp(args) > folder_mtp:
        out.append(
            f"num_nextn_predict_layers={folder_mtp} (ours: --model.mtp_depth={_mtp(args)}; lower it to"
            f" {folder_mtp})"
        )
    if config.get("moe_layer_freq", 1) != 1:
        out.append(f"moe_layer_freq={config['moe_layer_freq']} (ours: 1)")
    method = config.get("topk_method")
    if method is not None and method not in ("noaux_tc", "greedy", "group_limited_greedy"):
        out.append(f"topk_method={method!r} (ours: noaux_tc, greedy or group_limited_greedy)")
    entry, theta = _rope(config)
    if theta is not None and float(theta) != args.rope_theta:
        out.append(f"rope_theta={theta} (ours: {args.rope_theta})")
    kind = rope_kind(config)
    if kind not in ("default", "yarn"):
        out.append(f"rope scaling {kind!r} (ours: yarn or none)")
    if kind == "yarn":
        mine = {
            "factor": args.rope_factor,
            "original_max_position_embeddings": args.original_seq_len,
            "beta_fast": args.beta_fast,
            "beta_slow": args.beta_slow,
        }
        for key, ours in mine.items():
            if entry.get(key) is not None and float(entry[key]) != float(ours):
                out.append(f"rope_scaling.{key}={entry[key]} (ours: {ours})")
        mscale, all_dim = entry.get("mscale"), entry.get("mscale_all_dim")
        if all_dim:
            if mscale is not None and float(mscale) != float(all_dim):
                out.append(
                    f"rope_scaling.mscale={mscale} != mscale_all_dim={all_dim} (our single mscale cannot"
                    " express two values)"
                )
            elif float(all_dim) != args.mscale:
                out.append(f"rope_scaling.mscale_all_dim={all_dim} (ours: mscale {args.mscale})")
    for key, ours in (
        ("attention_bias", False),
        ("hidden_act", "silu"),
        ("tie_word_embeddings", False),
    ):
        if config.get(key, ours) != ours:
            out.append(f"{key}={config[key]!r} (ours: {ours!r})")
    return out
