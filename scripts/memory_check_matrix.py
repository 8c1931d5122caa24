"""The job matrix of scripts/memory_check.py: which real CPU jobs it runs, each as a name,
its ranks and short config overrides, and the dimensions they must cover (REQUIRED_TAGS,
checked by tests/unit/test_memory_check.py). Torch-free; memory_check.py runs the jobs."""

from __future__ import annotations

import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = {
    "llama3": "train_configs/llama3_debug.toml",
    "deepseek_v3": "train_configs/deepseek_v3_debug.toml",
    "qwen3": "train_configs/qwen3_debug.toml",
    "qwen3_moe": "train_configs/qwen3_moe_debug.toml",
}
MODEL_OF_PREFIX = {"llama": "llama3", "ds": "deepseek_v3", "qwen": "qwen3", "qmoe": "qwen3_moe"}
# Every run of every job (dry and real): CPU, 3 steps, seq 128, no TensorBoard, and no memory
# budget: the reshard plan then cannot depend on the memory free on this shared machine at
# the time, and the trainer's start-up prediction (the dry run's simulation again, in a child
# of rank 0, as long as the run itself) is skipped; the budget changes nothing predicted.
# fp32 parameters and local batch 2 unless the job says otherwise.
BASE = (
    "--training.device=cpu",
    "--training.steps=3",
    "--training.seq_len=128",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
)
DEFAULTS = {"training.mixed_precision_param": "float32", "training.local_batch_size": "2"}
# Short names of the config keys the matrix sets (a full key `section.key=value` works too).
KEYS = {
    "lbs": "training.local_batch_size",
    "gbs": "training.global_batch_size",
    "dtype": "training.mixed_precision_param",
    "impl": "parallelism.fsdp_implementation",
    "rep": "parallelism.data_parallel_replicate_degree",
    "shard": "parallelism.data_parallel_shard_degree",
    "tp": "parallelism.tensor_parallel_degree",
    "pp": "parallelism.pipeline_parallel_degree",
    "ep": "parallelism.expert_parallel_degree",
    "cp": "parallelism.context_parallel_degree",
    "mask": "model.attn_mask",
    "schedule": "parallelism.pipeline_parallel_schedule",
    "mbs": "parallelism.pipeline_parallel_microbatch_size",
    "split": "parallelism.pipeline_parallel_split_points",
    "reshard": "parallelism.reshard_after_forward",
    "fsdp_ac": "activation_checkpoint.fsdp_ac_policy",
}
# ckpt=async: a checkpoint every step, saved asynchronously (its staged copy is memory)
CKPT_PRESETS = {
    "async": {
        "checkpoint.enable": "true",
        "checkpoint.interval": "1",
        "checkpoint.async_mode": "async",
    }
}
# f8=<preset>: float8 linears (torchao; the debug TOMLs keep the output head in high precision)
_F8 = {"model.converters": "quantize.linear.float8"}
_F8_AG = {
    "quantize.linear.float8.enable_fsdp_float8_all_gather": "true",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": "true",
}
F8_PRESETS = {
    "tensorwise": {**_F8, "quantize.linear.float8.enable_fsdp_float8_all_gather": "false"},
    "all_gather": {**_F8, **_F8_AG},
    "rowwise": {
        **_F8,
        "quantize.linear.float8.enable_fsdp_float8_all_gather": "false",
        "quantize.linear.float8.recipe_name": "rowwise",
    },
}
# ac=<preset>: the activation-checkpointing modes by their usual names
AC_PRESETS = {
    "none": {"activation_checkpoint.mode": "none"},
    "op": {
        "activation_checkpoint.mode": "selective",
        "activation_checkpoint.selective_ac_option": "op",
    },
    "layer": {
        "activation_checkpoint.mode": "selective",
        "activation_checkpoint.selective_ac_option": "2",
    },
    "full": {"activation_checkpoint.mode": "full"},
}

# The matrix: job name (llama_* = Llama3, ds_* = DeepSeek-V3, qwen_* = Qwen3 dense with tied
# embeddings, qmoe_* = Qwen3 MoE with its balance loss), ranks, overrides. Every PP job
# has microbatch size 1, so its local batch is its microbatch count; ZBVZeroBubble's 4 stages
# (two per rank) need split points for Llama3's 6 blocks. Gradient accumulation: global
# batch = 2 x local x data-parallel degree.
MATRIX = """
# name                                  ranks  overrides
llama_fsdp2                             2
llama_fsdp2_reshard_always              2      reshard=always
llama_fsdp2_reshard_never               2      reshard=never
llama_fsdp2_ac_op                       2      ac=op
llama_fsdp2_ac_layer                    2      ac=layer
llama_fsdp2_ac_full                     2      ac=full
llama_fsdp2_bf16                        2      dtype=bfloat16
llama_fsdp2_grad_accum                  2      gbs=8
llama_fsdp2_4                           4
llama_fsdp2_8                           8      lbs=1
llama_simple_fsdp                       2      impl=simple_fsdp
llama_simple_fsdp_ac_full_save          2      impl=simple_fsdp ac=full fsdp_ac=save
llama_simple_fsdp_ac_full_recompute     2      impl=simple_fsdp ac=full fsdp_ac=recompute
llama_simple_fsdp_ac_op_save            2      impl=simple_fsdp ac=op fsdp_ac=save
llama_simple_fsdp_ac_layer_recompute    2      impl=simple_fsdp ac=layer fsdp_ac=recompute
llama_simple_fsdp_bf16_never            2      impl=simple_fsdp dtype=bfloat16 reshard=never
llama_hsdp                              4      rep=2 shard=2
llama_simple_hsdp                       4      impl=simple_fsdp rep=2 shard=2
llama_ddp                               2      rep=2 shard=1
llama_tp                                2      tp=2
llama_fsdp2_tp                          4      tp=2
llama_pp_1F1B_mb2                       2      pp=2 schedule=1F1B lbs=2 mbs=1
llama_pp_1F1B_mb8                       2      pp=2 schedule=1F1B lbs=8 mbs=1
llama_pp_Interleaved1F1B_mb2            2      pp=2 schedule=Interleaved1F1B lbs=2 mbs=1
llama_pp_Interleaved1F1B_mb8            2      pp=2 schedule=Interleaved1F1B lbs=8 mbs=1
llama_pp_ZBVZeroBubble_mb4              2      pp=2 schedule=ZBVZeroBubble lbs=4 mbs=1 split=layers.2,layers.4,layers.5
llama_pp_ZBVZeroBubble_mb8              2      pp=2 schedule=ZBVZeroBubble lbs=8 mbs=1 split=layers.2,layers.4,layers.5
llama_pp_fsdp2_1F1B_mb4                 4      pp=2 schedule=1F1B lbs=4 mbs=1
llama_pp_fsdp2_Interleaved1F1B_mb4_always 4    pp=2 schedule=Interleaved1F1B lbs=4 mbs=1 reshard=always
llama_pp_fsdp2_ZBVZeroBubble_mb2        4      pp=2 schedule=ZBVZeroBubble lbs=2 mbs=1 split=layers.2,layers.4,layers.5
ds_fsdp2                                2
ds_ddp                                  2      rep=2 shard=1
ds_ep_all_of_dp_shard                   2      ep=2
ds_fsdp2_ep                             4      ep=2
ds_ep_ac_op                             2      ep=2 ac=op
ds_ep_ac_full                           2      ep=2 ac=full
ds_ep_bf16                              2      ep=2 dtype=bfloat16
ds_ep_grad_accum                        2      ep=2 gbs=8
ds_hsdp_ep                              4      rep=2 shard=2 ep=2
ds_simple_fsdp_ep_never                 4      impl=simple_fsdp ep=2 reshard=never
ds_tp_ep                                2      tp=2 ep=2
ds_pp_ep_1F1B_mb4                       4      pp=2 schedule=1F1B lbs=4 mbs=1 ep=2
llama_cp2                               2      cp=2
llama_cp2_fsdp2_ac_op                   4      cp=2 ac=op
llama_cp2_block_causal                  2      cp=2 mask=block_causal
llama_pp_cp2_1F1B_mb4                   4      pp=2 cp=2 schedule=1F1B lbs=4 mbs=1
llama_fsdp2_muon                        2      optimizer.name=Muon
llama_tp_muon                           2      tp=2 optimizer.name=Muon
llama_hsdp_muon                         4      rep=2 shard=2 optimizer.name=Muon
ds_fsdp2_ep_muon                        4      ep=2 optimizer.name=Muon
ds_cp2_ep                               4      cp=2 ep=2
# Qwen3: QK-norm, tied embeddings (one root parameter; under PP a copy on the last stage), MoE
qwen_fsdp2                              2
qwen_simple_fsdp_ac_full                2      impl=simple_fsdp ac=full
qwen_tp                                 2      tp=2
qwen_pp_1F1B_mb4                        2      pp=2 schedule=1F1B lbs=4 mbs=1
qwen_cp2                                2      cp=2
qmoe_ep_all_of_dp_shard                 2      ep=2
qmoe_pp_ep_1F1B_mb4                     4      pp=2 schedule=1F1B lbs=4 mbs=1 ep=2
qmoe_pp_fsdp2_always_ac_op              4      pp=2 schedule=1F1B lbs=4 mbs=1 reshard=always ac=op
# asynchronous checkpoints every step: from step 2 on, every rank holds the staged copy
llama_fsdp2_ckpt_async                  2      ckpt=async
ds_fsdp2_ep_ckpt_async                  4      ep=2 ckpt=async
# upstream's feature keys: the ring of K/V chunks, expert tensor parallel, the optimizer in
# backward (no gradient alive at the peak), CPU offload (on CPU the host is the device), and
# upstream's uneven pipeline split (6 blocks + embedding + output: 2 | 3 | 3 | 0 blocks)
llama_cp2_alltoall                      2      cp=2 parallelism.context_parallel_rotate_method=alltoall
ds_tp_etp                               2      tp=2 parallelism.expert_tensor_parallel_degree=2
llama_fsdp2_early_step                  2      optimizer.early_step_in_backward=true training.max_norm=0
llama_fsdp2_cpu_offload                 2      training.enable_cpu_offload=true
llama_pp_Interleaved1F1B_uneven         2      pp=2 schedule=Interleaved1F1B lbs=4 mbs=1
# float8 linears (torchao): FSDP2 with and without the float8 all-gather, rowwise, TP's float8
# styles, op SAC, PP, DeepSeek-V3's dense parts under EP
llama_fsdp2_f8                          2      f8=tensorwise
llama_fsdp2_f8_all_gather               2      f8=all_gather
llama_fsdp2_f8_all_gather_bf16          2      f8=all_gather dtype=bfloat16
llama_fsdp2_f8_rowwise                  2      f8=rowwise
llama_fsdp2_f8_ac_op                    2      f8=all_gather ac=op
llama_tp_f8                             2      tp=2 f8=tensorwise
llama_pp_f8_1F1B_mb4                    2      pp=2 schedule=1F1B lbs=4 mbs=1 f8=tensorwise
ds_ep_f8                                2      ep=2 f8=tensorwise
"""

# The dimensions the matrix must cover (tests/unit/test_memory_check.py), as tags().
REQUIRED_TAGS = {
    "model:llama3",
    "model:deepseek_v3",
    "model:qwen3",
    "model:qwen3_moe",
    "dp:fsdp2",
    "dp:simple_fsdp",
    "dp:hsdp",
    "dp:ddp",
    "ac:none",
    "ac:op",
    "ac:layer",
    "ac:full",
    "fsdp_ac:save",
    "fsdp_ac:recompute",
    "pp:1F1B",
    "pp:Interleaved1F1B",
    "pp:ZBVZeroBubble",
    "pp_mb:2",
    "pp_mb:4",
    "pp_mb:8",
    "tp",
    "ep:part_of_dp_shard",
    "ep:all_of_dp_shard",
    "grad_accum",
    "dtype:float32",
    "dtype:bfloat16",
    "reshard:auto",
    "reshard:always",
    "reshard:never",
    "cp",
    "mask:block_causal",
    "checkpoint:async",
    "float8",
}


# ---------------------------------------------------------------- the matrix


@dataclass(frozen=True)
class Job:
    name: str
    ngpu: int
    model: str
    settings: tuple[tuple[str, str], ...]  # (full config key, value), in the table's order

    @property
    def config_file(self) -> str:
        return os.path.join(ROOT, CONFIGS[self.model])

    def value(self, key: str, default: str = "") -> str:
        return dict(self.settings).get(key, default)

    def overrides(self) -> list[str]:
        """The run's config overrides (dump folder and mode excluded)."""
        given = dict(self.settings)
        defaults = [f"--{k}={v}" for k, v in DEFAULTS.items() if k not in given]
        return [*BASE, *defaults, *(f"--{k}={v}" for k, v in self.settings)]


def parse_settings(tokens: list[str], where: str) -> tuple[tuple[str, str], ...]:
    """`short=value` / `section.key=value` / `ac=<preset>` tokens -> ((full key, value), ...)."""
    out: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not value:
            raise ValueError(f"{where}: '{token}' is not key=value")
        if key in ("ac", "ckpt", "f8"):
            presets = {"ac": AC_PRESETS, "ckpt": CKPT_PRESETS, "f8": F8_PRESETS}[key]
            if value not in presets:
                raise ValueError(f"{where}: {key}={value}: one of {', '.join(presets)}")
            pairs = presets[value].items()
        elif key in KEYS:
            pairs = [(KEYS[key], value)]
        elif "." in key:
            pairs = [(key, value)]
        else:
            raise ValueError(
                f"{where}: unknown short key '{key}' (one of ac, ckpt, f8, {', '.join(KEYS)}, or section.key)"
            )
        for k, v in pairs:
            if k in out:
                raise ValueError(f"{where}: {k} set twice")
            out[k] = v
    return tuple(out.items())


def parse_matrix(text: str | None = None) -> list[Job]:
    """MATRIX (or `text` in its format) -> jobs."""
    jobs = []
    for n, line in enumerate((MATRIX if text is None else text).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, ngpu, *tokens = line.split()
        where = f"matrix line {n} ({name})"
        model = next((m for p, m in MODEL_OF_PREFIX.items() if name.startswith(p + "_")), None)
        if model is None:
            raise ValueError(
                f"{where}: a job name starts with one of {', '.join(p + '_' for p in MODEL_OF_PREFIX)}"
            )
        if not ngpu.isdigit() or not 1 <= int(ngpu) <= 8:
            raise ValueError(f"{where}: ranks '{ngpu}' must be 1..8")
        jobs.append(Job(name, int(ngpu), model, parse_settings(tokens, where)))
    names = [j.name for j in jobs]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise ValueError(f"matrix: job names used twice: {', '.join(dup)}")
    return jobs


@dataclass(frozen=True)
class Shape:
    rep: int
    shard: int
    tp: int
    pp: int
    ep: int
    cp: int
    local_batch: int
    global_batch: int | str  # "auto": local x dp
    microbatch_size: int

    @property
    def dp(self) -> int:
        return self.rep * self.shard


def shape(job: Job) -> Shape:
    """The job's degrees (dp_shard "auto" resolved as the trainer does) and batch sizes."""

    def num(key: str, default: int | str) -> int | str:
        value = job.value(key, str(default))
        return "auto" if value in ("auto", "-1") else int(value)  # -1: the older spelling of auto

    rep, tp, pp, cp = (
        num(KEYS["rep"], 1),
        num(KEYS["tp"], 1),
        num(KEYS["pp"], 1),
        num(KEYS["cp"], 1),
    )
    shard = num(KEYS["shard"], "auto")
    if shard == "auto":
        shard = job.ngpu // (rep * tp * pp * cp)
    if rep * shard * tp * pp * cp != job.ngpu:
        raise ValueError(
            f"{job.name}: degrees rep {rep} x shard {shard} x cp {cp} x tp {tp} x pp {pp}"
            f" != {job.ngpu} ranks"
        )
    lbs = num(KEYS["lbs"], int(DEFAULTS["training.local_batch_size"]))
    return Shape(
        rep,
        shard,
        tp,
        pp,
        num(KEYS["ep"], 1),
        cp,
        lbs,
        num(KEYS["gbs"], "auto"),
        num(KEYS["mbs"], 1),
    )


def tags(job: Job) -> set[str]:
    """The matrix dimensions a job covers (REQUIRED_TAGS), from its settings."""
    s = shape(job)
    impl = job.value(KEYS["impl"], "fsdp2")
    out = {
        f"model:{job.model}",
        f"dtype:{job.value(KEYS['dtype'], DEFAULTS[KEYS['dtype']])}",
        f"reshard:{job.value(KEYS['reshard'], 'auto')}",
    }
    if s.rep > 1 and s.shard > 1:
        out.add("dp:hsdp")
    elif s.rep > 1:
        out.add("dp:ddp")
    if s.shard > 1:
        out.add(f"dp:{impl}")
    mode = job.value("activation_checkpoint.mode", "none")
    option = job.value("activation_checkpoint.selective_ac_option", "op")
    out.add("ac:" + (mode if mode != "selective" else "op" if option == "op" else "layer"))
    if job.value(KEYS["fsdp_ac"], "auto") != "auto":
        out.add(f"fsdp_ac:{job.value(KEYS['fsdp_ac'])}")
    if s.pp > 1:
        schedule = job.value(KEYS["schedule"], "1F1B")
        microbatches = s.local_batch // s.microbatch_size
        out |= {f"pp:{schedule}", f"pp_mb:{microbatches}", f"pp:{schedule}:mb{microbatches}"}
    if s.tp > 1:
        out.add("tp")
    if s.ep > 1:
        out.add("ep:all_of_dp_shard" if s.ep // (s.tp * s.cp) == s.shard else "ep:part_of_dp_shard")
    if s.cp > 1:
        out.add("cp")
    if job.value(KEYS["mask"], "causal") != "causal":
        out.add(f"mask:{job.value(KEYS['mask'])}")
    if s.global_batch != "auto" and s.global_batch > s.local_batch * s.dp:
        out.add("grad_accum")
    if job.value("checkpoint.async_mode", "disabled") == "async":
        out.add("checkpoint:async")
    if job.value("model.converters"):
        out.add("float8")
    return out
