"""Upstream torchtitan's integration suite (v0.2.2) as data: every case of its
tests/integration_tests/{features,models,h100,ft}.py, 58 in all, the 4 it disables included
(torchtitan/experiments/simple_fsdp/tests/integration_tests.py, 20 more, is an experiment's
own suite and not listed). upstream_suite.py runs them against this repository.

A case is upstream's: its name (test_name), description (test_descr), ranks (ngpu, upstream's
default 4), and its runs in order, each the override strings upstream appends to
`CONFIG_FILE=<base_config.toml> NGPU=<ngpu> ./run_train.sh --job.dump_folder <out>/<name>`,
written as upstream writes them (some strings hold a key and its value, or two keys; the
shell splits them). The runs of one case share the dump folder: a second run resumes from
the first's checkpoint. Where upstream's runner does more than append the strings:

- {dump} and {steps} in a string: upstream's path of the first run's last checkpoint
  (artifacts-to-be-uploaded/<name>/hf_checkpoint/step-10 on its CI), said for our folder and
  step count;
- tool "generate": upstream runs scripts/generate/run_llama_generate.sh on the checkpoint
  instead of training; tool "estimate": scripts/estimate/run_memory_estimation.sh;
- suite "ft": TRAIN_FILE=torchtitan.experiments.ft.train, and FT_ARGS put before the strings.
"""

from __future__ import annotations

from dataclasses import dataclass

FEATURES = "tests/integration_tests/features.py"
MODELS = "tests/integration_tests/models.py"
H100 = "tests/integration_tests/h100.py"
FT = "tests/integration_tests/ft.py"
SOURCES = {"features": FEATURES, "models": MODELS, "h100": H100, "ft": FT}

# upstream's ft.py, before every run's strings (one replica group of all 8 ranks)
FT_ARGS = (
    "--model.name=llama3_ft",
    "--fault_tolerance.enable",
    "--fault_tolerance.replica_id=0",
    "--fault_tolerance.group_size=8",
)

# TOMLs upstream's strings name -> our key-for-key copies of them
UPSTREAM_TOMLS = {
    "./tests/integration_tests/base_config.toml": "tests/upstream/base_config.toml",
    "./torchtitan/models/llama3/train_configs/debug_model.toml": "tests/upstream/llama3_debug_model.toml",
    "./torchtitan/models/deepseek_v3/train_configs/debug_model.toml": "tests/upstream/deepseek_v3_debug_model.toml",
    "./torchtitan/models/qwen3/train_configs/qwen3_moe_debug.toml": "tests/upstream/qwen3_moe_debug.toml",
}


@dataclass(frozen=True)
class Run:
    """One command of a case: the override strings, and the tool upstream runs them with."""

    overrides: tuple[str, ...]
    tool: str = "train"  # train | generate | estimate (see the module docstring)


@dataclass(frozen=True)
class UpstreamCase:
    suite: str  # features | models | h100 | ft
    name: str  # upstream's test_name
    description: str  # upstream's test_descr
    runs: tuple[Run, ...]
    ngpu: int = 4
    disabled: bool = False  # upstream skips it (a TODO of its own)
    # run by `make test` (test_upstream_suite.py), the rest with --slow: the base case, a
    # resume, a pipeline and the reshard key on upstream's base TOML; the other layouts are
    # parity cases of `make test` already (hsdp, grad_accum, ...)
    fast: bool = False

    @property
    def source(self) -> str:
        """The upstream file it comes from."""
        return SOURCES[self.suite]


def _case(suite, name, description, *runs, ngpu=4, disabled=False, fast=False) -> UpstreamCase:
    made = tuple(r if isinstance(r, Run) else Run(tuple(r)) for r in runs)
    return UpstreamCase(suite, name, description, made, ngpu, disabled, fast)


def _f(*args, **kw) -> UpstreamCase:
    return _case("features", *args, **kw)


def _m(*args, **kw) -> UpstreamCase:
    return _case("models", *args, **kw)


def _h(*args, **kw) -> UpstreamCase:
    return _case("h100", *args, **kw)


CKPT = "--checkpoint.enable"
TP2, CP2, PP2 = (
    "--parallelism.tensor_parallel_degree 2",
    "--parallelism.context_parallel_degree 2",
    "--parallelism.pipeline_parallel_degree 2",
)
DS = "--model.name deepseek_v3"
FLOAT8 = (
    "--model.converters quantize.linear.float8",
    "--quantize.linear.float8.enable_fsdp_float8_all_gather",
    "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
)
OFFLOAD_TP_CP = (
    "--parallelism.tensor_parallel_degree=2",
    "--parallelism.context_parallel_degree=2",
)
PP3D = (
    PP2,
    "--parallelism.data_parallel_shard_degree 2",
    TP2,
)

FEATURE_CASES = [
    _f(
        "default",
        "default",
        ["--profiling.enable_profiling", "--metrics.enable_tensorboard"],
        fast=True,
    ),
    _f("1d_compile", "1D compile", ["--compile.enable"]),
    _f(
        "1d_compile_sac_op",
        "1D compile with selective op AC",
        [
            "--compile.enable",
            "--activation_checkpoint.mode selective",
            "--activation_checkpoint.selective_ac_option op",
        ],
    ),
    _f("2d_eager", "2D eager", [TP2]),
    _f("2d_compile", "2D compile", ["--compile.enable", TP2]),
    _f(
        "2d_asynctp_compile",
        "2D async TP compile",
        ["--compile.enable", TP2, "--parallelism.enable_async_tensor_parallel"],
        disabled=True,
    ),
    _f(
        "full_checkpoint",
        "Checkpoint Integration Test - Save Load Full Checkpoint",
        [CKPT],
        [CKPT, "--training.steps 20"],
        fast=True,
    ),
    _f(
        "model_only_hf_checkpoint",
        "Checkpoint Integration Test - save load model only checkpoint in HF definition and format",
        [
            CKPT,
            "--checkpoint.folder hf_checkpoint",
            "--checkpoint.last_save_model_only",
            "--checkpoint.last_save_in_hf",
        ],
        [
            CKPT,
            "--checkpoint.initial_load_path {dump}/hf_checkpoint/step-{steps}/",
            "--checkpoint.initial_load_model_only",
            "--checkpoint.initial_load_in_hf",
        ],
    ),
    _f(
        "last_save_model_only_fp32",
        "Checkpoint Integration Test - Save Model Only fp32",
        [CKPT, "--checkpoint.last_save_model_only"],
    ),
    _f(
        "last_save_model_only_bf16",
        "Checkpoint Integration Test - Save Model Only bf16",
        [CKPT, "--checkpoint.last_save_model_only", "--checkpoint.export_dtype bfloat16"],
    ),
    _f(
        "pp_looped_zero_bubble",
        "PP looped zero bubble test",
        [
            "--parallelism.pipeline_parallel_degree 4",
            "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble",
        ],
        ngpu=4,
    ),
    _f(
        "pp_zbv",
        "PP zero bubble test (v shaped)",
        [PP2, "--parallelism.pipeline_parallel_schedule ZBVZeroBubble"],
        ngpu=2,
    ),
    _f(
        "pp_1f1b",
        "PP 1D test 1F1B",
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule 1F1B",
            "--parallelism.data_parallel_shard_degree 1",
        ],
        ngpu=2,
        fast=True,
    ),
    _f(
        "pp_gpipe",
        "PP 1D test GPipe",
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule GPipe",
            "--parallelism.data_parallel_shard_degree 1",
        ],
        ngpu=2,
    ),
    _f(
        "pp_dp_1f1b",
        "PP+DP 1F1B 2D test",
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule 1F1B",
            "--parallelism.data_parallel_shard_degree 2",
        ],
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule 1F1B",
            "--parallelism.pipeline_parallel_layers_per_stage 4",
            "--parallelism.data_parallel_shard_degree 2",
        ],
    ),
    _f(
        "pp_dp_gpipe",
        "PP+DP GPipe 2D test",
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule GPipe",
            "--parallelism.data_parallel_shard_degree 2",
        ],
    ),
    _f("pp_tp", "PP+TP 2D test", [PP2, TP2]),
    _f(
        "pp_dp_tp",
        "PP+DP+TP 3D test with save/load resume ckpt",
        [CKPT, *PP3D],
        ["--training.steps 20", CKPT, *PP3D],
        ngpu=8,
    ),
    _f("3d_compile", "PP+DP+TP 3D test with torch.compile", [*PP3D, "--compile.enable"], ngpu=8),
    _f(
        "pp_looped_1f1b",
        "PP looped 1F1B test",
        [
            "--parallelism.pipeline_parallel_degree 4",
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
        ],
        [
            "--parallelism.pipeline_parallel_degree 4",
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
            "--parallelism.pipeline_parallel_layers_per_stage 1",
        ],
        ngpu=4,
    ),
    _f(
        "pp_custom_csv",
        "PP with custom pipeline schedule loaded from CSV file",
        [
            PP2,
            "--parallelism.pipeline_parallel_schedule PipelineScheduleMulti",
            "--parallelism.pipeline_parallel_schedule_csv ./tests/assets/custom_schedule.csv",
        ],
        ngpu=2,
    ),
    _f(
        "optimizer_foreach",
        "Foreach Optimizer Test",
        ["--optimizer.name AdamW --optimizer.implementation foreach"],
        ngpu=2,
    ),
    _f(
        "ddp",
        "DDP",
        [
            "--parallelism.data_parallel_shard_degree=1",
            "--parallelism.data_parallel_replicate_degree=4",
        ],
        ngpu=4,
    ),
    _f(
        "hsdp",
        "HSDP",
        [
            "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.data_parallel_replicate_degree=2",
        ],
        ngpu=4,
    ),
    _f(
        "fsdp+flex_attn",
        "FSDP+FLEX_ATTN",
        [
            "--parallelism.data_parallel_shard_degree=4",
            "--activation_checkpoint.mode='full'",
            "--model.flavor=debugmodel_flex_attn",
        ],
        ngpu=4,
    ),
    _f(
        "fsdp+flex_attn+per_op_sac",
        "FSDP + FLEX + per op SAC",
        [
            "--parallelism.data_parallel_shard_degree=4",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
            "--model.flavor=debugmodel_flex_attn",
        ],
        ngpu=4,
    ),
    _f(
        "fsdp+varlen_attn+per_op_sac",
        "FSDP+VARLEN_ATTN + per op SAC",
        [
            "--parallelism.data_parallel_shard_degree=4",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
            "--model.flavor=debugmodel_varlen_attn",
        ],
        ngpu=4,
    ),
    _f(
        "cp_allgather",
        "CP (allgather)",
        [
            "--parallelism.context_parallel_degree=4",
            "--parallelism.context_parallel_rotate_method='allgather'",
        ],
        ngpu=4,
    ),
    _f(
        "cp_alltoall",
        "CP (alltoall)",
        [
            "--parallelism.context_parallel_degree=4",
            "--parallelism.context_parallel_rotate_method='alltoall'",
        ],
        ngpu=4,
    ),
    _f(
        "hsdp+tp",
        "HSDP+TP",
        [
            "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.tensor_parallel_degree=2",
        ],
        ngpu=8,
    ),
    _f(
        "fsdp+cp",
        "FSDP+CP",
        ["--parallelism.data_parallel_shard_degree=2", "--parallelism.context_parallel_degree=2"],
        ngpu=4,
    ),
    _f(
        "hsdp+cp_without_dp_shard",
        "HSDP+CP (without dp_shard)",
        [
            "--parallelism.data_parallel_shard_degree=1",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.context_parallel_degree=2",
        ],
        ngpu=4,
    ),
    _f(
        "hsdp+cp_with_dp_shard",
        "HSDP+CP (with dp_shard)",
        [
            "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.context_parallel_degree=2",
        ],
        ngpu=8,
    ),
    _f(
        "fsdp+tp+cp",
        "FSDP+TP+CP",
        [
            "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.context_parallel_degree=2",
        ],
        ngpu=8,
    ),
    _f(
        "cpu_offload+opt_in_bwd+TP+DP+CP",
        "Enable CPU Offload, Optimizer in backward with TP, DP, CP",
        [
            CKPT,
            *OFFLOAD_TP_CP,
            "--training.enable_cpu_offload",
            "--optimizer.early_step_in_backward",
        ],
        [
            *OFFLOAD_TP_CP,
            "--parallelism.data_parallel_replicate_degree=2",
            "--training.enable_cpu_offload",
            "--optimizer.early_step_in_backward",
        ],
        ngpu=8,
    ),
    _f(
        "fsdp2_memory_estimation",
        "FSDP2 Memory Tracking and Estimation",
        Run(("--memory_estimation.enable",), "estimate"),
        ngpu=2,
        disabled=True,
    ),
    _f(
        "test_generate",
        "Generation script test",
        [CKPT],
        Run((), "generate"),
        ngpu=2,
    ),
    _f(
        "fsdp_reshard_always",
        "Test always resharding after forward pass",
        ["--parallelism.fsdp_reshard_after_forward always"],
        ngpu=2,
        fast=True,
    ),
    _f(
        "optional_checkpoint",
        "Optional checkpoint",
        [CKPT, "--training.steps 10"],
        [
            CKPT,
            "--checkpoint.exclude_from_loading lr_scheduler,dataloader,optimizer",
            TP2,
            "--training.steps 20",
        ],
    ),
    _f("float8_emulation", "Float8 emulation test", [*FLOAT8, "--quantize.linear.float8.emulate"]),
    _f(
        "gradient_accumulation",
        "Gradient accumulation",
        ["--training.local_batch_size 8", "--training.global_batch_size 32"],
        ngpu=2,
    ),
    _f(
        "validation_tp_cp_pp",
        "Validation test with tp, cp, pp",
        [
            "--validation.enable",
            "--validation.dataset c4_test",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.context_parallel_degree=2",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
        ],
        ngpu=8,
    ),
    _f(
        "dataloader_kwargs",
        "Dataloader kwargs (via CLI args)",
        [
            "--training.dataloader.num_workers",
            "2",
            "--training.dataloader.pin_memory",
            "--training.dataloader.persistent_workers",
            "--training.dataloader.prefetch_factor",
            "4",
        ],
        ngpu=2,
    ),
]

MODEL_CASES = [
    _m(
        "deepseek_v3_fsdp+ep+compile",
        "DeepSeek V3 FSDP+EP+compile",
        [
            DS,
            "--parallelism.data_parallel_shard_degree 4",
            "--parallelism.expert_parallel_degree 2",
            "--compile.enable",
        ],
        ngpu=4,
    ),
    _m(
        "pp_dualpipev",
        "PP dual pipe v schedule test",
        [
            DS,
            PP2,
            "--parallelism.expert_parallel_degree 2",
            "--parallelism.pipeline_parallel_schedule DualPipeV",
            "--activation_checkpoint.mode 'none'",
        ],
        ngpu=4,
    ),
    _m(
        "deepseek_v3_pp+fsdp+tp+ep",
        "DeepSeek V3 PP+FSDP+TP+EP",
        [
            DS,
            PP2,
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
            "--parallelism.data_parallel_shard_degree 2",
            TP2,
            "--parallelism.expert_parallel_degree 4",
            "--parallelism.expert_tensor_parallel_degree 1",
        ],
        ngpu=8,
    ),
    _m(
        "deepseek_v3_pp+fsdp+tp+ep+etp",
        "DeepSeek V3 PP+FSDP+TP+EP+ETP",
        [
            DS,
            PP2,
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
            "--parallelism.data_parallel_shard_degree 2",
            TP2,
            "--parallelism.expert_parallel_degree 2",
            "--parallelism.expert_tensor_parallel_degree 2",
        ],
        ngpu=8,
    ),
    _m(
        "deepseek_v3_flex+pp+fsdp+ep+sacop",
        "DeepSeek V3 Flex+PP+FSDP+EP+SACOP",
        [
            DS,
            "--model.flavor debugmodel_flex_attn",
            "--parallelism.data_parallel_shard_degree 4",
            PP2,
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
            "--parallelism.expert_parallel_degree 4",
            "--activation_checkpoint.mode 'selective'",
            "--activation_checkpoint.selective_ac_option 'op'",
        ],
        ngpu=8,
    ),
    _m(
        "qwen3_fsdp+tp",
        "Qwen3 FSDP+TP",
        ["--model.name qwen3", "--parallelism.data_parallel_shard_degree 2", TP2],
        ngpu=4,
    ),
    _m(
        "qwen3_fsdp+tp+ep+etp",
        "Qwen3 FSDP+TP+EP+ETP",
        [
            "--model.name qwen3",
            "--model.flavor debugmodel_moe",
            "--parallelism.data_parallel_shard_degree 2",
            TP2,
            "--parallelism.expert_parallel_degree 2",
            "--parallelism.expert_tensor_parallel_degree 2",
        ],
        ngpu=4,
    ),
    _m(
        "llama4_pp+fsdp+tp+ep+compile",
        "Llama 4 PP+FSDP+TP+EP+compile",
        [
            "--model.name llama4",
            PP2,
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
            "--parallelism.data_parallel_shard_degree 2",
            TP2,
            "--parallelism.expert_parallel_degree 4",
            "--parallelism.expert_tensor_parallel_degree 1",
            "--compile.enable",
        ],
        ngpu=8,
    ),
    _m(
        "gpt_oss_fsdp+tp+ep+compile",
        "Gpt-oss FSDP+TP+EP+compile",
        [
            "--model.name gpt_oss",
            "--parallelism.data_parallel_shard_degree 4",
            TP2,
            "--parallelism.expert_parallel_degree 4",
            "--parallelism.expert_tensor_parallel_degree 1",
            "--compile.enable",
        ],
        ngpu=8,
    ),
]

H100_CASES = [
    _h(
        "2d_asynctp_compile",
        "2D async TP compile",
        ["--compile.enable", TP2, "--parallelism.enable_async_tensor_parallel"],
        disabled=True,
    ),
    _h("float8", "Float8 test", list(FLOAT8), fast=True),
    _h(
        "fsdp+tp+cp+compile+float8",
        "FSDP+async TP+PP+torch.compile+Float8",
        [
            "--compile.enable",
            "--parallelism.data_parallel_shard_degree 2",
            TP2,
            PP2,
            "--parallelism.enable_async_tensor_parallel",
            *FLOAT8,
        ],
        ngpu=8,
        disabled=True,
    ),
    _h(
        "hsdp+cp+compile+float8",
        "HSDP+CP+torch.compile+Float8",
        [
            "--compile.enable",
            "--parallelism.data_parallel_shard_degree 2",
            "--parallelism.data_parallel_replicate_degree 2",
            CP2,
            *FLOAT8,
        ],
        ngpu=8,
    ),
    _h(
        "simplefsdp_deepseekv3_auto_bucketing",
        "[Experimental, non-blocking landing if fails] SimpleFSDP DeepSeekV3 auto_bucketing",
        [
            "--job.config_file ./torchtitan/models/deepseek_v3/train_configs/debug_model.toml",
            "--model.name simple_fsdp.deepseek_v3",
            "--parallelism.tensor_parallel_degree 1",
            "--parallelism.expert_parallel_degree 8",
            "--job.custom_config_module=torchtitan.experiments.simple_fsdp.job_config",
            "--compile.graph_passes auto_bucketing",
            "--activation_checkpoint.mode none",
            "--compile.backend inductor",
            "--compile.enable",
        ],
        ngpu=8,
    ),
]

FT_CASES = [
    _case(
        "ft",
        "default_torchft",
        "Default TorchFT integration test",
        ["--training.steps 10", CKPT],
        ngpu=8,
    ),
]

CASES: list[UpstreamCase] = FEATURE_CASES + MODEL_CASES + H100_CASES + FT_CASES


def case_id(case: UpstreamCase) -> str:
    """A name unique over the suites (2d_asynctp_compile is in features and h100)."""
    return (
        case.name if sum(c.name == case.name for c in CASES) == 1 else f"{case.suite}/{case.name}"
    )
