"""DeepSeek-V3's parameters (model.py: MLA; dense FFN, then MoE blocks; MTP modules), TP as in
parallelize.py (LoRA down-projections, their norms, the router and eh_proj whole); torch-free
(models/shapes.py)."""

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
    def attention(a: str) -> list[Param]:
        n, qk = args.n_heads, args.qk_head_dim
        if args.q_lora_rank == 0:
            q = [linear(f"{a}.wq", n * qk, args.dim, COLWISE)]
        else:
            q = [
                linear(f"{a}.wq_a", args.q_lora_rank, args.dim, None),
                norm(f"{a}.q_norm", args.q_lora_rank),
                linear(f"{a}.wq_b", n * qk, args.q_lora_rank, COLWISE),
            ]
        return q + [
            linear(f"{a}.wkv_a", args.kv_lora_rank + args.qk_rope_head_dim, args.dim, None),
            norm(f"{a}.kv_norm", args.kv_lora_rank),
            linear(
                f"{a}.wkv_b",
                n * (args.qk_nope_head_dim + args.v_head_dim),
                args.kv_lora_rank,
                COLWISE,
            ),
            linear(f"{a}.wo", args.dim, n * args.v_head_dim, ROWWISE),
        ]

    def moe(m: str) -> list[Param]:
        e, h = args.n_routed_experts, args.moe_inter_dim
        experts = [
            Param(f"{m}.experts.w1", (e, h, args.dim), expert=True),
            Param(f"{m}.experts.w2", (e, args.dim, h), expert=True),
            Param(f"{m}.experts.w3", (e, h, args.dim), expert=True),
        ]
        shared = (
            swiglu(f"{m}.shared_experts", args.dim, h * args.n_shared_experts)
            if args.n_shared_experts
            else []
        )
        return [linear(f"{m}.router.gate", e, args.dim, None), *experts, *shared]

    def block(i: int, b: str = "") -> list[Param]:
        b = b or block_name(i)
        ffn = (
            moe(f"{b}.moe")
            if i >= args.n_dense_layers
            else swiglu(f"{b}.feed_forward", args.dim, args.inter_dim)
        )
        return [
            norm(f"{b}.attention_norm", args.dim),
            *attention(f"{b}.attention"),
            norm(f"{b}.ffn_norm", args.dim),
            *ffn,
        ]

    def mtp(k: int) -> list[Param]:
        """Multi-token-prediction depth k (last stage): norms, eh_proj (TP keeps it whole) and
        block n_layers + k."""
        m = f"mtp.{k}"
        return [
            norm(f"{m}.enorm", args.dim),
            norm(f"{m}.hnorm", args.dim),
            linear(f"{m}.eh_proj", args.dim, 2 * args.dim, None),
            *block(args.n_layers + k, f"{m}.block"),
            norm(f"{m}.norm", args.dim),
        ]

    first, last = decoder_ends(args)
    last += [p for k in range(args.mtp_depth) for p in mtp(k)]
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last)
