"""resolve_parts and its AC regions on real models on meta: the plan a rank would apply,
without a process group (dims are a plain record of degrees)."""

from types import SimpleNamespace

import torch

from torchtitan.checks import load_config
from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.distributed.reshard_policy import resolve
from torchtitan.models.flavors import model_args
from torchtitan.models.train_spec import get_train_spec
from torchtitan.training.build import plan_records, resolve_parts
from torchtitan.training.planned_job import MetaModel, PlannedJob
from torchtitan.units import GIB


def _parts(model_name: str, argv: list[str], dims: dict, world: int, pp_rank: int = 0):
    cfg, _ = load_config([f"--model.name={model_name}", "--model.flavor=tiny", *argv], world)
    spec = get_train_spec(model_name)
    args = model_args(model_name, "tiny", 2048, 64, cfg.moe)
    with torch.device("meta"):
        model = spec.model_cls(args)
    d = SimpleNamespace(**{"pp": 1, "tp": 1, "ep": 1, "etp": 1, "dp_shard": world, **dims})
    d.expert_shards = d.ep * d.etp
    return resolve_parts(PlannedJob(cfg, MetaModel(spec, model, args), d, "cpu"), pp_rank)


def test_deepseek_experts_are_units_of_their_block_on_the_experts_mesh():
    parts = _parts("deepseek_v3", ["--parallelism.expert_parallel_degree=2"], {"ep": 2}, 2)
    (part,) = parts.plans
    names = [u.name for u in part.units]
    assert names == [
        "tok_embeddings",
        "layers.0",
        "layers.1",
        "layers.1.moe.experts",
        "layers.2",
        "layers.2.moe.experts",
        "layers.3",
        "layers.3.moe.experts",
        "",
    ]
    experts = [u for u in part.units if u.kind is UnitKind.EXPERTS]
    assert [u.block for u in experts] == ["layers.1", "layers.2", "layers.3"]
    # EP 2 halves the experts' bytes on a rank: 3 stacks of [8, 32, 64] fp32 / 2
    assert {u.param_bytes for u in experts} == {3 * 8 * 32 * 64 * 4 // 2}
    flags = part.reshard_flags
    # "last block" covers the last block's experts too; earlier blocks and their experts reshard
    assert flags["layers.3"] is False and flags["layers.3.moe.experts"] is False
    assert flags["layers.2"] is True and flags["layers.2.moe.experts"] is True
    # AC regions are blocks, never the nested experts; plan.json names the experts' mesh only
    assert list(part.regions) == ["layers.0", "layers.1", "layers.2", "layers.3"]
    units = plan_records(parts)[0]["fsdp_units"]
    assert [u.get("mesh") for u in units if u["name"].endswith("experts")] == ["experts"] * 3
    assert all("mesh" not in u for u in units if not u["name"].endswith("experts"))


def test_simple_fsdp_regions_recompute_resharded_units_outside_blocks():
    parts = _parts("llama3", ["--parallelism.fsdp_implementation=simple_fsdp"], {}, 2)
    (part,) = parts.plans
    # the embeddings reshard (auto) and belong to no block: a region of their own re-gathers them
    assert part.regions["tok_embeddings"].compute == "none"
    assert part.regions["tok_embeddings"].fsdp_comm == "recompute"
    assert part.regions["layers.3"].fsdp_comm is None  # the last block keeps its gathers; no AC
    assert part.regions["layers.0"].fsdp_comm == "recompute"


def test_pipeline_stage_without_moe_layers_has_no_experts_units():
    argv = [
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_split_points=layers.1",
        "--training.local_batch_size=4",
        "--parallelism.expert_parallel_degree=2",
    ]
    stage0 = _parts("deepseek_v3", argv, {"pp": 2, "ep": 2, "dp_shard": 2}, 4, pp_rank=0)
    stage1 = _parts("deepseek_v3", argv, {"pp": 2, "ep": 2, "dp_shard": 2}, 4, pp_rank=1)
    assert [u.name for u in stage0.plans[0].units] == ["tok_embeddings", "layers.0"]
    assert [u.kind for u in stage1.plans[0].units].count(UnitKind.EXPERTS) == 3
    # under PP every unit is kept: one gather per step instead of one per microbatch
    assert not any(stage1.plans[0].reshard_flags.values())


def _flags(plan) -> list[dict[str, bool]]:
    return [{name: d.reshard for name, d in part.items()} for part in plan]


def test_budget_frees_a_block_together_with_its_experts():
    # MoE blocks: the experts are a unit of their own inside the block; the budget frees both.
    experts = UnitKind.EXPERTS
    parts = [
        [
            FsdpUnit("layers.0", GIB, block="layers.0"),
            FsdpUnit("layers.0.moe.experts", 2 * GIB, "layers.0", experts),
            FsdpUnit("layers.1", GIB, block="layers.1"),
            FsdpUnit("layers.1.moe.experts", 2 * GIB, "layers.1", experts),
            FsdpUnit("", GIB),
        ]
    ]
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note="over")
    assert _flags(plan) == [
        {
            "layers.0": True,
            "layers.0.moe.experts": True,
            "layers.1": False,
            "layers.1.moe.experts": False,
            "": False,
        }
    ]
    # without PP the last block's experts are kept with it ("last" speaks of blocks)
    plan = resolve("auto", False, "1F1B", 1, parts)
    assert _flags(plan) == [
        {
            "layers.0": True,
            "layers.0.moe.experts": True,
            "layers.1": False,
            "layers.1.moe.experts": False,
            "": False,
        }
    ]


def test_simple_fsdp_gathers_kept_units_once_per_step_only_under_pp():
    from torchtitan.distributed.simple_fsdp import gathers_once_per_step

    def once(plan):
        return [gathers_once_per_step(u, plan.microbatches) for u in plan.units]

    simple = ["--parallelism.fsdp_implementation=simple_fsdp"]
    pp = ["--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4"]
    (no_pp,) = _parts("llama3", simple, {}, 2).plans
    assert no_pp.microbatches == 1
    assert not any(once(no_pp))
    # PP, auto: every unit is kept, so every unit is gathered once per step (4 microbatches)
    (stage0,) = _parts("llama3", simple + pp, {"pp": 2, "dp_shard": 2}, 4).plans
    assert stage0.microbatches == 4
    assert list(zip([u.name for u in stage0.units], once(stage0))) == [
        ("tok_embeddings", True),
        ("layers.0", True),
        ("layers.1", True),
    ]
    # units the plan reshards, or whose region recomputes FSDP's gathers, gather per microbatch
    (always,) = _parts(
        "llama3",
        simple + pp + ["--parallelism.reshard_after_forward=always"],
        {"pp": 2, "dp_shard": 2},
        4,
    ).plans
    assert not any(once(always))
    recompute = [
        "--activation_checkpoint.mode=full",
        "--activation_checkpoint.fsdp_ac_policy=recompute",
    ]
    (regathered,) = _parts("llama3", simple + pp + recompute, {"pp": 2, "dp_shard": 2}, 4).plans
    assert once(regathered) == [True, False, False]


def test_units_carry_their_decision_and_region():
    # one record from the model's declaration to the collectives: each unit knows its reshard
    # decision and the region that holds it (its block's; the embeddings' own under SimpleFSDP)
    (plan,) = _parts(
        "deepseek_v3",
        ["--parallelism.fsdp_implementation=simple_fsdp", "--activation_checkpoint.mode=selective"],
        {},
        2,
    ).plans
    experts = plan.unit("layers.2.moe.experts")
    assert experts.region is plan.regions["layers.2"] is plan.unit("layers.2").region
    assert experts.decision == plan.unit("layers.2").decision and experts.reshard is True
    assert plan.unit("tok_embeddings").region == plan.regions["tok_embeddings"]
    assert plan.unit("").region is None and plan.unit("").reshard is False
    assert plan.record()["fsdp_units"][-1]["name"] == "<root>"
