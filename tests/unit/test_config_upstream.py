"""Upstream torchtitan's (v0.2.2) keys: every key of its job_config accepted, its spellings of
our keys, its extension point (job.custom_config_module) and what is refused here."""

import pytest

from torchtitan.checks import load_config
from torchtitan.config import ConfigError, JobConfig, build_config
from torchtitan.config.manager import DEPRECATED_KEYS, field_types, help_text, section_of, sections

DEPRECATED = {f"{s}.{k}" for s, k in DEPRECATED_KEYS}

EXT = "tests.unit.config_extension_example"

# Every key of upstream v0.2.2's torchtitan/config/job_config.py (plus the keys its SimpleFSDP and
# fault-tolerance extensions add), by dotted name: facts, listed here so that a key we drop
# fails this test.
UPSTREAM_KEYS = """
job.config_file job.dump_folder job.description job.print_config job.save_config_file
job.custom_config_module profiling.enable_profiling profiling.save_traces_folder
profiling.profile_freq profiling.profiler_active profiling.profiler_warmup
profiling.enable_memory_snapshot profiling.save_memory_snapshot_folder metrics.log_freq
metrics.enable_tensorboard metrics.disable_color_printing metrics.save_tb_folder
metrics.save_for_all_ranks metrics.enable_wandb model.name model.flavor model.hf_assets_path
model.tokenizer_path model.converters model.print_after_conversion optimizer.name optimizer.lr
optimizer.beta1 optimizer.beta2 optimizer.eps optimizer.weight_decay optimizer.implementation
optimizer.early_step_in_backward lr_scheduler.warmup_steps lr_scheduler.total_steps
lr_scheduler.decay_ratio lr_scheduler.decay_type lr_scheduler.min_lr_factor
training.dataloader.num_workers training.dataloader.persistent_workers
training.dataloader.pin_memory training.dataloader.prefetch_factor training.dataset
training.dataset_path training.local_batch_size training.global_batch_size training.seq_len
training.max_norm training.steps training.enable_cpu_offload training.dtype
training.mixed_precision_param training.mixed_precision_reduce training.gc_freq
training.gc_debug parallelism.data_parallel_replicate_degree
parallelism.data_parallel_shard_degree parallelism.fsdp_reshard_after_forward
parallelism.tensor_parallel_degree parallelism.disable_loss_parallel
parallelism.enable_async_tensor_parallel parallelism.pipeline_parallel_degree
parallelism.module_fqns_per_model_part parallelism.pipeline_parallel_first_stage_less_layers
parallelism.pipeline_parallel_last_stage_less_layers parallelism.pipeline_parallel_layers_per_stage
parallelism.pipeline_parallel_schedule parallelism.pipeline_parallel_schedule_csv
parallelism.pipeline_parallel_microbatch_size parallelism.pipeline_parallel_expert_parallel_overlap
parallelism.context_parallel_degree parallelism.context_parallel_load_balancer
parallelism.context_parallel_rotate_method parallelism.expert_parallel_degree
parallelism.expert_tensor_parallel_degree parallelism.expert_parallel_comm_backend
checkpoint.enable checkpoint.enable_ft_dataloader_checkpoints checkpoint.folder
checkpoint.interval checkpoint.initial_load_path checkpoint.initial_load_model_only
checkpoint.initial_load_in_hf checkpoint.initial_load_in_hf_quantized
checkpoint.last_save_model_only checkpoint.last_save_in_hf checkpoint.export_dtype
checkpoint.async_mode checkpoint.keep_latest_k checkpoint.load_step
checkpoint.exclude_from_loading checkpoint.enable_first_step_checkpoint
checkpoint.create_seed_checkpoint checkpoint.load_only activation_checkpoint.mode
activation_checkpoint.selective_ac_option
activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns
activation_checkpoint.early_stop activation_checkpoint.memory_budget
activation_checkpoint.visualize_memory_budget_pareto activation_checkpoint.preserve_rng_state
activation_checkpoint.determinism_check activation_checkpoint.debug compile.enable
compile.components compile.backend compile.graph_passes
quantize.linear.float8.enable_fsdp_float8_all_gather
quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp
quantize.linear.float8.recipe_name quantize.linear.float8.filter_fqns
quantize.linear.float8.emulate quantize.linear.mx.mxfp8_dim1_cast_kernel_choice
quantize.linear.mx.recipe_name quantize.linear.mx.filter_fqns quantize.grouped_mm.float8.fqns
quantize.grouped_mm.mx.recipe_name quantize.grouped_mm.mx.fqns comm.init_timeout_seconds
comm.train_timeout_seconds comm.trace_buf_size comm.save_traces_folder
comm.save_traces_file_prefix comm.mode memory_estimation.enable
memory_estimation.disable_fake_mode fault_tolerance.enable fault_tolerance.process_group
fault_tolerance.process_group_timeout_ms fault_tolerance.replica_id fault_tolerance.group_size
fault_tolerance.min_replica_size fault_tolerance.semi_sync_method fault_tolerance.sync_steps
fault_tolerance.should_quantize fault_tolerance.fragment_sync_delay
fault_tolerance.fragment_update_alpha fault_tolerance.module_fqns_per_model_fragment
fault_tolerance.num_fragments experimental.custom_import experimental.custom_args_module
validation.enable validation.dataset validation.dataset_path validation.local_batch_size
validation.seq_len validation.freq validation.steps validation.dataloader.num_workers
validation.dataloader.persistent_workers validation.dataloader.pin_memory
validation.dataloader.prefetch_factor debug.seed debug.deterministic
debug.deterministic_warn_only debug.moe_force_load_balance
""".split()


def _ours(dotted: str) -> str:
    """The key an upstream key sets here (itself, or ours it spells)."""
    from torchtitan.config.upstream import UPSTREAM_SPELLINGS

    section, key = dotted.rsplit(".", 1)
    if (section, key) in UPSTREAM_SPELLINGS:
        return UPSTREAM_SPELLINGS[(section, key)].target
    if (section, key) in DEPRECATED_KEYS:
        new = DEPRECATED_KEYS[(section, key)][0]
        return new if "." in new else f"{section}.{new}"
    return dotted


def test_every_upstream_key_is_accepted_and_in_help():
    text = help_text()
    for dotted in UPSTREAM_KEYS:
        ours = _ours(dotted)
        section, key = ours.rsplit(".", 1)
        assert key in field_types(sections()[section]), dotted
        # in --help: as a key of ours, or on the upstream-spellings list naming ours
        assert f"  --{ours} (" in text and (
            dotted == ours or f"--{dotted} -> --{ours}" in text or dotted in DEPRECATED
        ), dotted


def test_upstream_values_on_the_command_line_and_nested_tables(tmp_path):
    toml = tmp_path / "u.toml"
    toml.write_text(
        "[training.dataloader]\nnum_workers = 0\npin_memory = true\n"
        '[quantize.linear.float8]\nfilter_fqns = ["output"]\nemulate = true\n'
        "[parallelism]\ndisable_loss_parallel = true\n"
        "[debug]\nseed = 7\n"
    )
    cfg, warnings = build_config([f"--job.config_file={toml}"])
    assert warnings == []  # upstream's current spellings warn nothing
    assert cfg.training.dataloader.num_workers == 0 and cfg.training.dataloader.pin_memory
    assert cfg.quantize.linear.float8.filter_fqns == ["output"]
    assert cfg.quantize.linear.float8.emulate is True
    assert cfg.parallelism.loss_parallel is False and cfg.training.seed == 7
    cfg, _ = build_config(
        [
            "--quantize.grouped_mm.float8.fqns=experts",
            '--parallelism.module_fqns_per_model_part=[["tok_embeddings","layers.0"],["norm"]]',
            "--experimental.custom_import=json",
        ]
    )
    assert cfg.quantize.grouped_mm.float8.fqns == ["experts"]
    assert cfg.parallelism.module_fqns_per_model_part == [["tok_embeddings", "layers.0"], ["norm"]]
    assert cfg.model.module == "json"


def test_upstream_model_prefix_and_fake_backend():
    cfg, warnings = build_config(["--model.name=simple_fsdp.deepseek_v3"])
    assert cfg.model.name == "deepseek_v3"
    assert cfg.parallelism.fsdp_implementation == "simple_fsdp" and warnings == []
    cfg, warnings = build_config(["--comm.mode=fake_backend"])
    assert cfg.job.dry_run is True
    assert warnings == [
        "'comm.mode = fake_backend' runs this fork's dry run (--job.dry_run): the job is planned"
        " on a fake process group and every rank role's memory is predicted"
    ]


def test_custom_config_module_adds_sections_and_keys(capsys):
    cfg, _ = build_config([f"--job.custom_config_module={EXT}", "--weather.sky=grey"])
    assert isinstance(cfg, JobConfig)
    assert cfg.weather.sky == "grey" and cfg.weather.days == 7
    assert cfg.training.my_custom_steps == 32
    assert cfg.training.steps == 99  # the extension's default wins
    assert cfg.training.seq_len == JobConfig().training.seq_len  # ours kept
    assert section_of(cfg, "weather").days == 7
    with pytest.raises(SystemExit):
        build_config([f"--job.custom_config_module={EXT}", "--help"])
    out = capsys.readouterr().out
    assert "[weather]" in out and "  --training.my_custom_steps (int, default 32)" in out
    assert "      Days of forecast." in out
    # the next job without the module has our keys only
    with pytest.raises(ConfigError, match="unknown config section 'weather'"):
        build_config(["--weather.sky=grey"])


def test_custom_config_module_errors_are_one_line():
    with pytest.raises(ConfigError) as e:
        build_config(["--job.custom_config_module=no_such_module_xyz"])
    assert str(e.value) == (
        "--job.custom_config_module: cannot import 'no_such_module_xyz' (ModuleNotFoundError:"
        " No module named 'no_such_module_xyz'); put it on PYTHONPATH or name an installed module"
    )
    with pytest.raises(ConfigError) as e:
        build_config(["--job.custom_config_module=json"])
    assert "module 'json' has no JobConfig dataclass" in str(e.value)


def test_upstream_extension_modules_are_built_in():
    for module in (
        "torchtitan.experiments.simple_fsdp.job_config",
        "torchtitan.components.ft.config",
    ):
        cfg, _ = build_config([f"--job.custom_config_module={module}"])
        assert type(cfg) is JobConfig
    cfg, _ = build_config(
        ["--compile.graph_passes=auto_bucketing", "--fault_tolerance.sync_steps=3"]
    )
    assert cfg.compile.graph_passes == "auto_bucketing" and cfg.fault_tolerance.sync_steps == 3


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--model.name=llama4"],
            "--model.name=llama4: upstream's Llama 4 (MoE with chunked attention) is not part of"
            " this fork; train llama3, deepseek_v3 or qwen3, or register your own with"
            " --model.module (docs/adding_a_model.md)",
        ),
        (["--model.name=gpt_oss"], "--model.name=gpt_oss: upstream's gpt-oss"),
        (
            ["--model.converters=mx"],
            "--model.converters=mx: MX (microscaling) training is not in this fork",
        ),
        (["--model.name=llama3_ft"], "--model.name=llama3_ft: upstream's fault-tolerant Llama 3"),
        (
            ["--parallelism.expert_parallel_comm_backend=deepep"],
            "--parallelism.expert_parallel_comm_backend=deepep: DeepEP's CUDA kernels",
        ),
        (["--comm.mode=local_tensor"], "--comm.mode=local_tensor: upstream's single-process"),
    ],
)
def test_what_cannot_run_here_is_refused_in_one_line(argv, expected):
    with pytest.raises(ConfigError) as e:
        load_config(argv, 1)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
