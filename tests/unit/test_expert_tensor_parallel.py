"""Expert tensor parallel (parallelism.expert_tensor_parallel_degree) and the MoE debug switch
debug.moe_force_load_balance: the degree rule, the mesh ETP asks for, the checks' lines, the
experts' bytes per rank, the dispatcher's copy index, the balance statistics summed over a
group, and round-robin routing. (Training against one rank: the qwen3_fsdp+tp+ep+etp and
deepseek_fsdp+tp+ep+etp parity cases, tests/integration/parity_cases.py.)"""

import tempfile

import pytest
import torch
import torch.distributed as dist
from config_helpers import config_error

from torchtitan.checks import load_config
from torchtitan.distributed.expert_parallel import AllToAllDispatcher
from torchtitan.distributed.job_shape import Degrees
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.models.common.moe import MoE, sequence_balance_loss, sum_over_group
from torchtitan.planning.memory.model_states import Param, local_numel

DS = ["--model.name=deepseek_v3", "--model.flavor=tiny"]
QWEN_MOE = ["--model.name=qwen3", "--model.flavor=tiny_moe"]
TP2, ETP2 = (
    "--parallelism.tensor_parallel_degree=2",
    "--parallelism.expert_tensor_parallel_degree=2",
)


def test_etp_must_be_one_or_tp():
    assert config_error(DS + [TP2, "--parallelism.expert_tensor_parallel_degree=4"], 4) == (
        "--parallelism.expert_tensor_parallel_degree=4: must be 1 (experts not split by TP)"
        " or tensor_parallel_degree=2 (each expert split over the TP ranks)"
    )
    assert config_error(DS + [ETP2], 2).startswith(
        "--parallelism.expert_tensor_parallel_degree=2: must be 1"
    )


def test_etp_refused_without_experts():
    assert config_error(["--model.flavor=tiny", TP2, ETP2], 2) == (
        "--parallelism.expert_tensor_parallel_degree=2: model llama3 has no experts; set it to 1"
    )


def test_etp_lets_ep_come_from_data_parallel_ranks_only():
    # etp 1 needs ep a multiple of tp; etp = tp does not (EP takes no TP rank)
    assert "a multiple of 2 (it is 1)" in config_error(DS + [TP2], 4)
    for world, extra in [
        (2, []),  # tp 2, ep 1: the experts split over TP only
        (4, ["--parallelism.expert_parallel_degree=2"]),
        (8, ["--parallelism.expert_parallel_degree=4"]),
    ]:
        load_config(DS + [TP2, ETP2, *extra], world)
    assert config_error(DS + [TP2, ETP2, "--parallelism.expert_parallel_degree=4"], 4) == (
        "--parallelism.expert_parallel_degree=4 takes 4 ranks from data_parallel_shard_degree=2 (ep),"
        " which does not divide it; pick an expert_parallel_degree of a divisor of 2"
    )


def test_qwen3_switch_loss_accepted_under_tp():
    load_config(QWEN_MOE + [TP2, ETP2, "--parallelism.expert_parallel_degree=2"], 4)
    load_config(QWEN_MOE + [TP2, "--parallelism.expert_parallel_degree=2"], 2)


def test_degrees_and_mesh_under_etp():
    d = ParallelDims(1, 4, 2, 1, 2, 8, 1, 2)  # dp_shard 4, tp 2, ep 2, etp 2
    assert d.ep_from_dp_shard == 2 and d.expert_shards == 4
    assert d.mesh_shape == {"dp_shard_mod_ep": 2, "dp_shard_in_ep": 2, "tp": 2}
    flat = {k.value: tuple(x.value for x in v) for k, v in d.flattened().items()}
    assert flat["ep"] == ("dp_shard_in_ep",)
    assert flat["ep_tp"] == ("dp_shard_in_ep", "tp")
    # etp 1: EP takes tp first
    d1 = ParallelDims(1, 4, 2, 1, 4, 8, 1, 1)
    assert d1.ep_from_dp_shard == 2 and "ep_tp" not in {k.value for k in d1.flattened()}
    # etp = tp without EP: experts split over TP alone, dp_shard_in_ep of size 1
    d2 = ParallelDims(1, 2, 2, 1, 1, 4, 1, 2)
    assert d2.mesh_shape == {"dp_shard_mod_ep": 2, "dp_shard_in_ep": 1, "tp": 2}


def test_expert_bytes_per_rank_under_etp():
    w1 = Param("layers.1.moe.experts.w1", (8, 32, 64), expert=True)
    w2 = Param("layers.1.moe.experts.w2", (8, 64, 32), expert=True)
    etp = Degrees(1, 2, 2, 1, 2, 4, 1, 2)  # ep from dp_shard (all of it): FSDP 1
    no_etp = Degrees(1, 2, 2, 1, 2, 4, 1, 1)  # ep takes tp: FSDP over dp_shard 2
    assert local_numel(w1, etp) == 4 * 16 * 64 and local_numel(w2, etp) == 4 * 64 * 16
    assert local_numel(w1, no_etp) == 2 * 32 * 64


def test_copies_index_places_each_row_once_per_tp_rank():
    disp = AllToAllDispatcher.__new__(AllToAllDispatcher)
    disp.size, disp.replicas, disp.num_experts = 4, 2, 4  # ep 2 x etp 2, 2 experts per EP rank
    counts = torch.tensor([1, 2, 0, 3])  # rows 0-2 to EP rank 0, rows 3-5 to EP rank 1
    idx = disp.copies_index(counts, 6)
    # send buffer: rows 0-2 (tp 0 of ep 0), rows 0-2 (tp 1), rows 3-5 (ep 1 tp 0), rows 3-5
    assert idx.tolist() == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]


def _one_rank_group():
    f = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
    return dist.group.WORLD.group_name


@pytest.fixture
def group():
    name = _one_rank_group()
    yield name
    dist.destroy_process_group()


def test_sum_over_group_keeps_value_and_gradient(group):
    t = torch.tensor([1.5, 2.25], requires_grad=True)
    out = sum_over_group(t, group)
    assert torch.equal(out, t.detach())
    (out * torch.tensor([3.0, 5.0])).sum().backward()
    assert t.grad.tolist() == [3.0, 5.0]


def test_sequence_loss_from_summed_statistics_matches_the_whole(group):
    torch.manual_seed(0)
    scores = torch.rand(2, 6, 4)
    indices = scores.topk(2, dim=-1).indices
    whole = sequence_balance_loss(scores, indices, 0.1)
    # a group of one rank holding every token: the same loss through the summed path
    summed = sequence_balance_loss(scores, indices, 0.1, (group, 1))
    torch.testing.assert_close(summed, whole, rtol=1e-6, atol=0)


def test_force_load_balance_gives_every_expert_the_same_count():
    torch.manual_seed(0)
    moe = MoE(dim=16, hidden=16, n_experts=8, top_k=2)
    moe.force_load_balance = True
    moe.train()
    moe(torch.randn(2, 12, 16))  # 24 tokens x 2 copies = 48 = 6 per expert
    assert moe.tokens_per_expert.tolist() == [6] * 8
    moe.force_load_balance = False
    moe.tokens_per_expert.zero_()
    moe(torch.randn(2, 12, 16) * 5)
    assert moe.tokens_per_expert.sum() == 48 and moe.tokens_per_expert.tolist() != [6] * 8
