"""Parity cases of upstream's feature keys (parity_cases.CASES takes them in), each
against the 1-rank reference of its model: context parallel's rotate methods and load
balancers (upstream's cp_allgather / cp_alltoall / fsdp+tp+cp, and the same for Qwen3 and
DeepSeek-V3, eager and compiled), FSDP2's CPU offload, and the optimizer stepped in backward
with offload (upstream's cpu_offload+opt_in_bwd+TP+DP+CP, both of its runs), and expert
tensor parallel (upstream's *+etp cases, and ETP with CP and SimpleFSDP).

The early step cannot clip (no global norm exists when a parameter steps): those cases set
max_norm 0, and match the reference (which clips at 1.0) because the tiny model's gradient norms
stay below 1 over the reference's steps (a clip then multiplies by exactly 1; run_tests.py
prints the reference's norms)."""

from parity_cases import DS, EP, ETP, PP, QWEN, QWEN_MOE, Case

CP2 = "--parallelism.context_parallel_degree=2"
CP4 = "--parallelism.context_parallel_degree=4"
TP = "--parallelism.tensor_parallel_degree=2"
A2A = "--parallelism.context_parallel_rotate_method=alltoall"
AG = "--parallelism.context_parallel_rotate_method=allgather"
NONE = "--parallelism.context_parallel_load_balancer=none"
COMPILE = "--compile.enable=true"
OFFLOAD = "--training.enable_cpu_offload=true"
INTERLEAVED = "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"
EARLY = ["--optimizer.early_step_in_backward=true", "--training.max_norm=0"]

CASES = [
    # upstream's: 4 ranks, CP 4 (global batch 8 = local 2 x 4 accumulation steps); in `make
    # test` the CP 2 cases below (`cp2` in parity_cases.py is allgather's)
    Case("cp_allgather", 4, [CP4, AG], slow=True),
    Case("cp_alltoall", 4, [CP4, A2A], slow=True),
    Case("cp_alltoall+none", 4, [CP4, A2A, NONE], slow=True),
    Case("cp_allgather+none", 4, [CP4, AG, NONE], slow=True),
    # upstream's fsdp+tp+cp: dp_shard 2 x tp 2 x cp 2
    Case("fsdp+tp+cp", 8, [CP2, TP, "--training.local_batch_size=4"], slow=True),
    Case("fsdp+tp+cp_alltoall", 8, [CP2, TP, A2A, "--training.local_batch_size=4"], slow=True),
    # compiled with aot_eager in `make test` (no inductor codegen; fsdp_compile runs inductor)
    Case(
        "cp2_alltoall+compile",
        2,
        [CP2, A2A, COMPILE, "--compile.backend=aot_eager", "--training.local_batch_size=8"],
    ),
    Case("qwen3_cp2_alltoall", 2, [CP2, A2A, "--training.local_batch_size=8"], model=QWEN),
    Case("deepseek_cp2_alltoall", 2, [CP2, A2A, "--training.local_batch_size=8"], model=DS),
    Case(
        "deepseek_cp2_alltoall+none+compile",
        2,
        [CP2, A2A, NONE, COMPILE, "--training.local_batch_size=8"],
        model=DS,
        slow=True,
    ),
    # FSDP2 CPU offload (a no-op copy on CPU, but the policy's path runs), clipping on
    Case("fsdp+cpu_offload", 2, [OFFLOAD, "--training.local_batch_size=4"]),
    # optimizer in backward: no accumulation (global batch = local x dp)
    Case("fsdp+opt_in_bwd", 2, [*EARLY, "--training.local_batch_size=4"]),
    # upstream's cpu_offload+opt_in_bwd+TP+DP+CP, its two runs: dp_shard 2 and dp_replicate 2
    Case(
        "cpu_offload+opt_in_bwd+tp+cp",
        8,
        [CP2, TP, OFFLOAD, *EARLY, "--training.local_batch_size=4"],
        slow=True,
    ),
    Case(
        "cpu_offload+opt_in_bwd+tp+cp+ddp",
        8,
        [
            CP2,
            TP,
            "--parallelism.data_parallel_replicate_degree=2",
            OFFLOAD,
            *EARLY,
            "--training.local_batch_size=4",
        ],
        slow=True,
    ),
    # Expert tensor parallel (etp = tp): each expert's matrices split over TP, EP from the
    # data-parallel ranks (upstream's cases of the same names). Qwen3 MoE with its Switch loss
    # under TP: the statistics are summed over TP (with loss parallel, Loss.objective adds the
    # plain balance loss to the replicated DTensor loss). In `make test` the 2-rank TP + ETP
    # cases of both models; the 4-rank ones (upstream's layouts) with --slow.
    Case(
        "qwen3_fsdp+tp+ep+etp",
        4,
        [TP, EP, ETP, "--training.local_batch_size=2"],
        model=QWEN_MOE,
        slow=True,
    ),
    # local batch 2: micro-batches of the reference's rows (the Switch loss is per micro-batch)
    Case("qwen3_moe_tp+etp", 2, [TP, ETP, "--training.local_batch_size=2"], model=QWEN_MOE),
    Case(
        "deepseek_fsdp+tp+ep+etp",
        4,
        [TP, EP, ETP, "--training.local_batch_size=4"],
        model=DS,
        slow=True,
    ),
    Case("deepseek_tp+etp", 2, [TP, ETP, "--training.local_batch_size=8"], model=DS),
    Case(
        "deepseek_v3_pp+fsdp+tp+ep+etp",
        8,
        [PP, TP, EP, ETP, "--training.local_batch_size=4", INTERLEAVED],
        model=DS,
        slow=True,
    ),
    # ETP with context parallel: EP takes the CP ranks (dp_shard 1), TP splits the experts
    Case(
        "deepseek_cp2+tp+ep+etp",
        4,
        [TP, EP, ETP, CP2, "--training.local_batch_size=8"],
        model=DS,
        slow=True,
    ),
    Case(
        "deepseek_simple_fsdp+tp+ep+etp",
        4,
        [
            TP,
            EP,
            ETP,
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--training.local_batch_size=4",
        ],
        model=DS,
        slow=True,
    ),
]
