"""Model states per rank (memory/model_states.py), the memory budget (memory/budget.py)
and the refusal before launch (validate.check_model_states): parameter counts exact against
the models built on meta, per-rank shards, the budget's sources, and the one-line refusal.
(Per-rank shards against the parallelized build on a fake process group:
tests/integration/test_memory_fake_world.py; nvidia-smi read, run_train.sh's refusal and the
torch-free check in processes of their own: tests/integration/test_checks_before_launch.py.)"""

import os

import pytest
import torch
from config_helpers import config_error  # noqa: E402

from torchtitan.checks import load_config
from torchtitan.config import build_config
from torchtitan.distributed.job_shape import Degrees
from torchtitan.distributed.pipeline_layout import plan_pipeline
from torchtitan.distributed.pipeline_parallel import split_model
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.registry import MODELS
from torchtitan.models.train_spec import get_train_spec
from torchtitan.planning.memory import budget as memory_budget
from torchtitan.planning.memory import model_states
from torchtitan.planning.memory.budget import Budget
from torchtitan.planning.memory.model_states import Param, local_numel, model_shapes
from torchtitan.units import GIB

VOCAB = 2048  # the bundled tokenizer's, for the flavors that take the tokenizer's vocabulary
ALL_FLAVORS = [
    (name, flavor)
    for name, flavors in ((n, e.flavors) for n, e in MODELS.items())
    for flavor in flavors
]


def run_args(name: str, flavor: str, **features):
    return model_args(name, flavor, VOCAB, 256, **features)


def meta_model(name: str, flavor: str):
    with torch.device("meta"):
        return get_train_spec(name).model_cls(run_args(name, flavor))


def shapes_of(params) -> dict[str, tuple[int, ...]]:
    return {p.name: p.shape for p in params}


# ----------------------------------------------------------------------------- exact counts


def test_every_registered_model_has_its_shapes():
    for name, entry in MODELS.items():  # each package declares its own, beside its model.py
        assert callable(entry.module("shapes").shapes), name


# DeepSeek-V3 with its multi-token-prediction module (the published checkpoints have one)
MTP_FLAVORS = [("deepseek_v3", flavor, {"mtp_depth": 1}) for flavor in ("tiny", "671B")]


@pytest.mark.parametrize("name,flavor,features", [(n, f, {}) for n, f in ALL_FLAVORS] + MTP_FLAVORS)
def test_parameters_equal_the_meta_model_name_by_name(name, flavor, features):
    """Every flavor of every model, 671B included (building it on meta takes 0.3 s): the same
    parameters, in the same order, with the same shapes; so the totals are equal too."""
    with torch.device("meta"):
        model = get_train_spec(name).model_cls(run_args(name, flavor, **features))
    shapes = model_shapes(name, run_args(name, flavor, **features))
    got = shapes_of(shapes.all())
    assert list(got.items()) == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sum(p.numel for p in shapes.all()) == sum(p.numel() for p in model.parameters())
    # the pieces a pipeline stage keeps or drops whole are the model's own (those it was built with)
    held = lambda names: {n for n in names if getattr(model, n) is not None}  # noqa: E731
    assert {p.name.split(".")[0] for p in shapes.first} == held(model.first_stage_modules)
    assert {p.name.split(".")[0] for p in shapes.last} == held(model.last_stage_modules)


def test_mtp_module_is_one_more_moe_block_with_its_projection():
    plain = model_shapes("deepseek_v3", run_args("deepseek_v3", "671B"))
    mtp = model_shapes("deepseek_v3", run_args("deepseek_v3", "671B", mtp_depth=1))
    dim = 7168
    extra = sum(p.numel for p in mtp.all()) - sum(p.numel for p in plain.all())
    assert extra == sum(p.numel for p in plain.blocks[-1]) + 2 * dim * dim + 3 * dim


def test_published_totals():
    assert (
        sum(p.numel for p in model_shapes("llama3", run_args("llama3", "405B")).all())
        == 405_853_388_800
    )
    assert (
        sum(p.numel for p in model_shapes("deepseek_v3", run_args("deepseek_v3", "671B")).all())
        == 671_026_404_352
    )
    # Qwen3 as its safetensors hold them (151,936 rows; the tied 0.6B stores one matrix)
    for flavor, total in (
        ("0.6B", 596_049_920),
        ("8B", 8_190_735_360),
        ("30B-A3B", 30_532_122_624),
        ("235B-A22B", 235_093_634_560),
    ):
        assert (
            sum(p.numel for p in model_shapes("qwen3", run_args("qwen3", flavor)).all()) == total
        ), flavor


def test_an_open_vocabulary_must_be_resolved_first():
    with pytest.raises(ValueError, match="vocab_size 0"):
        model_shapes("llama3", flavors_of("llama3")["tiny"])


@pytest.mark.parametrize(
    "name,flavor,pp,schedule,split_points,microbatches",
    [
        ("llama3", "8B", 4, "1F1B", [], 8),
        ("llama3", "70B", 2, "Interleaved1F1B", [], 8),  # 80 blocks: 2 ranks x 2 stages of 20
        ("deepseek_v3", "16B", 3, "Interleaved1F1B", [], 9),  # 27 blocks: 3 ranks x 3 stages of 3
        (
            "deepseek_v3",
            "671B",
            2,
            "DualPipeV",
            ["layers.2", "layers.31", "layers.50"],
            4,
        ),  # V: rank 0 has both ends
        ("qwen3", "0.6B", 4, "1F1B", [], 8),  # tied: the last stage holds the output copy
        ("qwen3", "4B", 2, "DualPipeV", [], 4),  # tied, V: rank 0 holds the embedding and its copy
        ("qwen3", "30B-A3B", 4, "Interleaved1F1B", [], 8),
    ],
)
def test_stages_equal_the_real_pipeline_split(
    name, flavor, pp, schedule, split_points, microbatches
):
    model = meta_model(name, flavor)
    shapes = model_shapes(name, run_args(name, flavor))
    layout = plan_pipeline(
        len(model.layers), pp, schedule, "auto", split_points, n_microbatches=microbatches
    )
    for pp_rank in range(pp):
        for stage_id, stage in split_model(model, layout, pp_rank):
            params = shapes.stage(
                layout.stages[stage_id], stage_id == 0, stage_id == layout.num_stages - 1
            )
            assert shapes_of(params) == {n: tuple(p.shape) for n, p in stage.named_parameters()}


# ----------------------------------------------------------------------------- per-rank shards


def degrees(dp_replicate=1, dp_shard=1, tp=1, pp=1, ep=1) -> Degrees:
    return Degrees(dp_replicate, dp_shard, tp, pp, ep, dp_replicate * dp_shard * tp * pp)


@pytest.mark.parametrize(
    "param,d,expected",
    [
        (Param("w", (10, 3), 0), degrees(), 30),  # one rank: everything
        (Param("w", (10, 3), 0), degrees(dp_shard=4), 3 * 3),  # FSDP: ceil(10 / 4) rows on rank 0
        (
            Param("w", (10, 3), 0),
            degrees(dp_replicate=2, dp_shard=2),
            5 * 3,
        ),  # HSDP: replicas keep whole shards
        (Param("w", (10, 3), 0), degrees(dp_replicate=4), 30),  # DDP: whole copies
        (
            Param("w", (10, 6), 0),
            degrees(dp_shard=2, tp=2),
            3 * 6,
        ),  # column-wise: 10 -> 5 -> ceil(5 / 2)
        (
            Param("w", (10, 6), 1),
            degrees(dp_shard=2, tp=2),
            5 * 3,
        ),  # row-wise: columns over TP, rows over FSDP
        (Param("n", (7,)), degrees(dp_shard=2, tp=2), 4),  # a norm: replicated over TP, ceil(7 / 2)
        (Param("w", (10, 3), 0), degrees(dp_shard=2, pp=4), 5 * 3),  # PP does not split a parameter
        # routed experts [8, 4, 2]: over EP on dim 0, then FSDP over the dp_shard ranks EP left
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=4),
            2 * 8,
        ),  # no EP: FSDP over dp_shard
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=4, ep=2),
            2 * 8,
        ),  # 4 experts, FSDP over 2
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=4, ep=4),
            2 * 8,
        ),  # EP = all of dp_shard: no FSDP
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=2, tp=2, ep=4),
            2 * 8,
        ),  # EP takes tp and dp_shard
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=4, tp=2, ep=2),
            1 * 8,
        ),  # ep = tp: 4 experts, FSDP over all 4
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_shard=16, ep=2),
            1 * 8,
        ),  # 4 experts over 8: padded to 1
        (
            Param("e", (8, 4, 2), expert=True),
            degrees(dp_replicate=2, dp_shard=2, ep=2),
            4 * 8,
        ),  # HSDP + EP
    ],
)
def test_local_numel(param, d, expected):
    assert local_numel(param, d) == expected


PP2 = "--parallelism.pipeline_parallel_degree=2"


def test_the_busiest_rank_and_where_it_is():
    cfg, _ = build_config(
        ["--model.flavor=405B", PP2, "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"]
    )
    ranks = model_states.job_rank_states(cfg, 8, run_args("llama3", "405B"))
    assert [r.stage_ids for r in ranks] == [(0, 2), (1, 3)]  # two stages per rank (upstream's)
    top = model_states.busiest(ranks)
    assert top.pp_rank == 1  # the output's [vocab, dim] plus the final norm outweigh the embeddings
    assert top.where() == "pipeline stages 1 and 3 of 4 (pipeline rank 1)"
    assert (top.params_bytes, top.grads_bytes, top.optimizer_bytes, top.total_bytes) == (
        4 * top.numel,
        4 * top.numel,
        8 * top.numel,
        16 * top.numel,
    )
    one = model_states.job_rank_states(build_config([])[0], 1, run_args("llama3", "debugmodel"))
    assert one[0].where() == "pipeline stage 0 of 1"


# ----------------------------------------------------------------------------- the budget


def cfg_with(*argv):
    return build_config(list(argv))[0]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(memory_budget, "gpu_memory_bytes", lambda: None)
    for key in ("LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def fake_meminfo(tmp_path, available_kb: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(
        f"MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_kb} kB\n"
    )
    return str(path)


def test_explicit_budget_and_no_budget(no_gpu):
    assert memory_budget.memory_budget(cfg_with("--planning.memory_budget_gib=12.5"), 8) == Budget(
        int(12.5 * GIB), "--planning.memory_budget_gib"
    )
    assert memory_budget.memory_budget(cfg_with("--planning.memory_budget_gib=none"), 8) is None


def test_cpu_default_from_meminfo(tmp_path, no_gpu, monkeypatch):
    meminfo = fake_meminfo(tmp_path, 20 * 2**20)  # 20 GiB in kB
    budget = memory_budget.memory_budget(cfg_with("--training.device=cpu"), 2, meminfo=meminfo)
    assert budget == Budget(
        10 * GIB - memory_budget.CPU_RANK_OVERHEAD_BYTES,
        "CPU: 20.0 GiB available / 2 ranks - 0.5 GiB per process",
    )
    assert (
        memory_budget.mem_available_bytes(str(tmp_path / "missing")) is None
    )  # not Linux: unknown
    # auto without a GPU is CPU too
    assert memory_budget.memory_budget(cfg_with(), 2, meminfo=meminfo) == budget
    # in a started rank the ranks' own resident memory is already out of MemAvailable
    monkeypatch.setattr(memory_budget, "resident_bytes", lambda: 384 * 2**20)
    started = memory_budget.memory_budget(cfg_with(), 2, meminfo=meminfo, started_rank=True)
    assert started.bytes == 10 * GIB - 128 * 2**20
    # by default it reads /proc/meminfo
    monkeypatch.setattr(memory_budget, "mem_available_bytes", lambda path="": 8 * GIB)
    assert (
        memory_budget.memory_budget(cfg_with(), 4).bytes
        == 2 * GIB - memory_budget.CPU_RANK_OVERHEAD_BYTES
    )
    assert memory_budget.memory_budget(cfg_with(), 64).bytes == 0  # never negative


def test_cuda_default_and_unknown(no_gpu, monkeypatch):
    assert (
        memory_budget.memory_budget(cfg_with("--training.device=cuda"), 8) is None
    )  # no nvidia-smi: unknown
    monkeypatch.setattr(memory_budget, "gpu_memory_bytes", lambda: [80 * GIB, 40 * GIB])
    budget = memory_budget.memory_budget(cfg_with(), 8)  # auto: GPUs listed
    assert budget == Budget(int(40 * GIB * 0.9), "CUDA: 40.0 GiB device memory - 10% margin")
    assert memory_budget.memory_budget(cfg_with("--training.device=cuda"), 8) == budget
    monkeypatch.setattr(memory_budget, "gpu_memory_bytes", lambda: [])
    assert memory_budget.memory_budget(cfg_with("--training.device=cuda"), 8) is None
    assert memory_budget.memory_budget(cfg_with(), 2).origin.startswith(
        "CPU: "
    )  # auto, no GPU listed


def test_ranks_on_this_node(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert memory_budget.ranks_on_this_node(16) == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert memory_budget.ranks_on_this_node(16) == 8


# ----------------------------------------------------------------------------- the refusal

V3_DEBUG = "train_configs/deepseek_v3_debug.toml"
REFUSAL_671B = (
    "--model.flavor=671B: model states alone need 4,999.5 GiB per rank (parameters 1,249.9, gradients 1,249.9,"
    " AdamW 2,499.8; pipeline stage 0 of 1, 2 ranks) but the memory budget is 10.0 GiB (CPU: 21.0 GiB available"
    " / 2 ranks - 0.5 GiB per process); use more ranks or sharding (NGPU, data_parallel_shard_degree,"
    " tensor_parallel_degree, pipeline_parallel_degree), or set --planning.memory_budget_gib (none: no budget)"
)


@pytest.fixture
def cpu_21_gib(no_gpu, monkeypatch):
    monkeypatch.setattr(memory_budget, "mem_available_bytes", lambda path="": 21 * GIB)


def test_refusal_line_for_671b_on_two_ranks(repo_root, cpu_21_gib):
    argv = ["--job.config_file", os.path.join(repo_root, V3_DEBUG), "--model.flavor=671B"]
    assert config_error(argv, 2) == REFUSAL_671B


def test_no_refusal_for_dry_runs_allowed_jobs_no_budget_or_enough(repo_root, cpu_21_gib):
    argv = ["--job.config_file", os.path.join(repo_root, V3_DEBUG), "--model.flavor=671B"]
    for extra in (
        "--job.dry_run=true",
        "--planning.allow_over_budget=true",
        "--planning.memory_budget_gib=none",
        "--planning.memory_budget_gib=5000",
    ):
        load_config(argv + [extra], 2)
    assert config_error(argv + ["--planning.memory_budget_gib=4999"], 2).endswith(
        "but the memory budget is 4,999.0 GiB (--planning.memory_budget_gib); use more ranks or sharding (NGPU,"
        " data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree), or set"
        " --planning.memory_budget_gib (none: no budget)"
    )


def test_unknown_cuda_budget_skips_the_check(repo_root, no_gpu):
    load_config(
        [
            "--job.config_file",
            os.path.join(repo_root, V3_DEBUG),
            "--model.flavor=671B",
            "--training.device=cuda",
        ],
        2,
    )


def test_small_jobs_pass_and_open_vocabularies_use_the_tokenizer(repo_root, cpu_21_gib):
    load_config(["--job.config_file", os.path.join(repo_root, V3_DEBUG)], 8)
    # debugmodel with the bundled tokenizer: 16 B x ~6M parameters is over a 0.05 GiB budget
    msg = config_error(["--planning.memory_budget_gib=0.05"], 1)
    assert msg.startswith("--model.flavor=debugmodel: model states alone need 0.1 GiB per rank")
    assert "pipeline stage 0 of 1, 1 rank)" in msg


@pytest.mark.parametrize("value", ["-2", "-0.5"])
def test_budget_value_out_of_range(value):
    assert config_error([f"--planning.memory_budget_gib={value}", "--job.dry_run=true"]) == (
        f"--planning.memory_budget_gib={float(value):g}: must be > 0 (GiB per rank), auto (the default budget of"
        " the device) or none (no budget)"
    )
