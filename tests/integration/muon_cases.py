"""The parity suite's Muon cases (optimizer.name = Muon, training/muon.py): each layout against
the 1-rank run of the same split and keys, with float32 Newton-Schulz (ns_dtype), within the
suite's fp32 bound: every matrix orthogonalized whole on every layout, as on one rank (by its
owner, muon_owners.py; muon_every_rank_fsdp: by every rank)."""

from parity_cases import Case

# Muon's lr as Keller Jordan's runs use it; AdamW's keys (the rest) stay the suite's
MUON = ["--optimizer.name=Muon", "--optimizer.muon_lr=0.02", "--optimizer.ns_dtype=float32"]
LLAMA_MUON, DS_MUON, QWEN_MUON = "llama3_muon", "deepseek_v3_muon", "qwen3_muon"
BF16_NS = ["--optimizer.name=Muon", "--optimizer.muon_lr=0.02"]  # ns_dtype: its default
MODELS = {
    "llama3_muon_bf16_ns": ("llama3", "tiny", BF16_NS),
    LLAMA_MUON: ("llama3", "tiny", MUON),
    DS_MUON: ("deepseek_v3", "tiny", MUON),
    QWEN_MUON: ("qwen3", "tiny", MUON),
}
TP = "--parallelism.tensor_parallel_degree=2"
PP = "--parallelism.pipeline_parallel_degree=2"
EP = "--parallelism.expert_parallel_degree=2"

CASES = [
    Case("muon_fsdp", 2, [], model=LLAMA_MUON),
    # bfloat16 Newton-Schulz (torch's default) against one rank's: the layout's gradients differ
    # in their last fp32 bits, and a bf16 rounding may then land one ulp apart (measured: losses
    # 3.6e-7, gradient norms 1.24e-5 over 10 steps)
    Case("muon_bf16_ns_fsdp", 2, [], model="llama3_muon_bf16_ns", rtol=2e-5),
    Case("muon_tp", 2, [TP, "--training.local_batch_size=8"], model=LLAMA_MUON, slow=True),
    Case(
        "muon_hsdp+tp",
        8,
        [TP, "--parallelism.data_parallel_replicate_degree=2"],
        model=LLAMA_MUON,
        slow=True,
    ),
    Case(
        "muon_simple_fsdp",
        2,
        ["--parallelism.fsdp_implementation=simple_fsdp"],
        model=LLAMA_MUON,
        slow=True,
    ),
    Case("muon_pp", 2, [PP, "--training.local_batch_size=8"], model=LLAMA_MUON, slow=True),
    Case("deepseek_muon_fsdp", 2, [], model=DS_MUON, slow=True),
    # routed experts with Muon: whole local experts (no exchange), and TP's shards of them
    Case("deepseek_muon_ep", 2, [EP], model=DS_MUON, slow=True),
    Case(
        "deepseek_muon_fsdp+tp+ep",
        4,
        [TP, EP, "--training.local_batch_size=4"],
        model=DS_MUON,
        slow=True,
    ),
    # every rank gathers and iterates every matrix: the same numbers as the owners'
    Case(
        "muon_every_rank_fsdp",
        2,
        ["--optimizer.muon_orthogonalize=every_rank"],
        model=LLAMA_MUON,
        slow=True,
    ),
    Case("qwen3_muon_fsdp", 2, [], model=QWEN_MUON, slow=True),
]
