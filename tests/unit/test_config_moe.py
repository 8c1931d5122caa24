"""Validation of the MoE keys and of expert parallel: one line naming the key and the fix."""

import pytest
from config_helpers import config_error

from torchtitan.checks import load_config

DS = ["--model.name=deepseek_v3", "--model.flavor=tiny"]


def test_deepseek_v3_layouts_that_fit_are_accepted():
    for world, argv in [
        (2, ["--parallelism.expert_parallel_degree=2"]),
        (4, ["--parallelism.expert_parallel_degree=2"]),
        (
            4,
            [
                "--parallelism.expert_parallel_degree=2",
                "--parallelism.fsdp_implementation=simple_fsdp",
            ],
        ),
        (4, ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=2"]),
        (8, ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=4"]),
        (
            8,
            [
                "--parallelism.pipeline_parallel_degree=2",
                "--parallelism.tensor_parallel_degree=2",
                "--parallelism.expert_parallel_degree=2",
                "--training.local_batch_size=4",
            ],
        ),
    ]:
        load_config(DS + argv, world)  # raises ConfigError if refused


@pytest.mark.parametrize(
    "world, argv, expected",
    [
        (
            4,
            ["--parallelism.expert_parallel_degree=3"],
            "--parallelism.expert_parallel_degree=3 takes 3 ranks from data_parallel_shard_degree=4 (ep / tp), which"
            " does not divide it; pick an expert_parallel_degree of tp x a divisor of 4",
        ),
        (
            4,
            ["--parallelism.tensor_parallel_degree=2"],
            "--parallelism.tensor_parallel_degree=2 with deepseek_v3 needs --parallelism.expert_parallel_degree a"
            " multiple of 2 (it is 1): under sequence parallel each TP rank routes its own tokens and EP, which takes"
            " every TP rank, brings them to their experts",
        ),
        (
            16,
            ["--parallelism.expert_parallel_degree=16"],
            "--parallelism.expert_parallel_degree=16 does not divide deepseek_v3 tiny n_routed_experts=8; pick a"
            " divisor of 8",
        ),
    ],
)
def test_expert_parallel_layouts_that_do_not_fit(world, argv, expected):
    assert config_error(DS + argv, world_size=world) == expected


def test_moe_keys():
    assert config_error(DS + ["--moe.top_k=5"]) == (
        "--moe.top_k=5 exceeds the 4 experts a token can reach (deepseek_v3 tiny: 1 of 2 groups of 4); pick at most 4"
    )
    assert config_error(DS + ["--moe.load_balance_coeff=-0.5"]) == (
        "--moe.load_balance_coeff=-0.5: must be >= 0 (0 disables it) or auto for the flavor's value"
    )
    assert (
        config_error(["--moe.top_k=2"])
        == "--moe.top_k: model llama3 has no experts; drop the [moe] settings"
    )
    assert config_error(
        DS
        + [
            "--moe.aux_loss_coeff=0.001",
            "--parallelism.pipeline_parallel_degree=2",
            "--training.local_batch_size=4",
        ],
        world_size=2,
    ) == (
        "--moe.aux_loss_coeff=0.001 (the sequence-wise balance loss) is not supported with"
        " --parallelism.pipeline_parallel_degree=2 yet; set --moe.aux_loss_coeff=0 (the bias-based balancing stays on)"
    )
    assert config_error(
        DS
        + [
            "--moe.aux_loss_coeff=0.001",
            "--parallelism.tensor_parallel_degree=2",
            "--parallelism.expert_parallel_degree=2",
        ],
        world_size=2,
    ) == (
        "--moe.aux_loss_coeff=0.001 (the sequence-wise balance loss) is not supported with"
        " --parallelism.tensor_parallel_degree=2 yet; set --moe.aux_loss_coeff=0 (the bias-based balancing stays on)"
    )
    load_config(DS + ["--moe.top_k=3", "--moe.score_func=softmax", "--moe.aux_loss_coeff=0.01"], 1)


def test_moe_overrides_reach_the_model_args():
    from torchtitan.models.flavors import model_args

    cfg, _ = load_config(
        DS + ["--moe.top_k=3", "--moe.score_func=softmax", "--moe.load_balance_coeff=0"], 1
    )
    args = model_args("deepseek_v3", "tiny", 2000, 64, cfg.moe)
    assert (
        args.n_activated_experts,
        args.score_func,
        args.load_balance_coeff,
        args.aux_loss_coeff,
    ) == (3, "softmax", 0.0, 0.0)
    default = model_args("deepseek_v3", "tiny", 2000, 64, load_config(DS, 1)[0].moe)
    assert (default.n_activated_experts, default.score_func, default.load_balance_coeff) == (
        2,
        "sigmoid",
        1e-3,
    )
