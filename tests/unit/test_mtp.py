"""Multi-token prediction (DeepSeek-V3 report, section 2.2), no process group: the MTP
modules' forward against a recomputation from their pieces, the labels and token ids the
step builds for them, the loss split, the FSDP units and the config checks."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from config_helpers import cfg_of, config_error

from torchtitan.checks import load_config
from torchtitan.distributed.context_parallel import ContextParallel
from torchtitan.distributed.plan import UnitKind
from torchtitan.models.common.attention import attention_inputs
from torchtitan.models.deepseek_v3.args import FLAVORS
from torchtitan.models.deepseek_v3.model import MTPModule, Transformer
from torchtitan.models.flavors import model_args
from torchtitan.training.loss import (
    IGNORE_INDEX,
    Loss,
    cross_entropy_loss,
    mtp_losses,
    mtp_shifted_labels,
)
from torchtitan.training.step import StepRunner

VOCAB, SEQ, BATCH = 97, 32, 2
DS = ["--model.name=deepseek_v3", "--model.flavor=tiny"]


def model_of(depth: int, seed: int = 0, **overrides) -> Transformer:
    args = dataclasses.replace(
        FLAVORS["tiny"], vocab_size=VOCAB, max_seq_len=SEQ, mtp_depth=depth, **overrides
    )
    model = Transformer(args)
    model.init_weights(seed, "cpu")
    return model


def tokens_and_mtp(depth: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        torch.randint(0, VOCAB, (BATCH, depth, SEQ), generator=g),
    )


# --------------------------------------------------------------------------- the model


def test_mtp_modules_have_the_published_parameter_names():
    model = model_of(2)
    assert list(model.mtp.keys()) == ["0", "1"]
    m = model.mtp["0"]
    assert isinstance(m, MTPModule)
    assert [n for n, _ in m.named_children()] == ["enorm", "hnorm", "eh_proj", "block", "norm"]
    assert m.eh_proj.weight.shape == (64, 128)
    # n_layers (4) + k >= n_dense_layers (1): a MoE block, the experts under block.moe
    assert "block.moe.experts.w1" in dict(m.named_parameters())
    names = [
        n for n, _ in model.named_parameters() if n.startswith("mtp.1.") and ".block." not in n
    ]
    assert names == [
        "mtp.1.enorm.weight",
        "mtp.1.hnorm.weight",
        "mtp.1.eh_proj.weight",
        "mtp.1.norm.weight",
    ]
    # shared, not copied: the embeddings and the head exist once
    assert not any("tok_embeddings" in n or "output" in n for n, _ in model.mtp.named_parameters())


def test_mtp_forward_shape_and_main_logits():
    model = model_of(2)
    tokens, mtp_tokens = tokens_and_mtp(2)
    with torch.no_grad():
        out = model(tokens, mtp_tokens=mtp_tokens)
        main = model(tokens)  # without mtp_tokens: the main logits only
    assert out.shape == (BATCH, 3 * SEQ, VOCAB)
    assert main.shape == (BATCH, SEQ, VOCAB)
    assert torch.equal(out[:, :SEQ], main)


def test_mtp_depth_logits_equal_a_recomputation_from_the_pieces():
    model = model_of(2)
    tokens, mtp_tokens = tokens_and_mtp(2)
    with torch.no_grad():
        out = model(tokens, mtp_tokens=mtp_tokens)
        attn = attention_inputs(SEQ, model.rope)
        h = model.tok_embeddings(tokens)
        for layer in model.layers.values():
            h = layer(h, attn)
        # depth 0 takes the last block's output BEFORE the final norm; depth 1 depth 0's block output
        for k in range(2):
            m = model.mtp[str(k)]
            e = model.tok_embeddings(mtp_tokens[:, k])
            h = m.block(
                m.eh_proj(torch.cat([m.enorm(e), m.hnorm(h)], dim=-1)), attn
            )  # embedding first
            expected = model.output(m.norm(h))
            assert torch.equal(out[:, (1 + k) * SEQ : (2 + k) * SEQ], expected), k
        # and the order matters: hidden state first gives other logits
        m = model.mtp["0"]
        assert not torch.equal(
            m.eh_proj(torch.cat([e, e * 2], -1)), m.eh_proj(torch.cat([e * 2, e], -1))
        )


def test_mtp_depth_0_leaves_the_model_unchanged():
    plain, with_mtp = model_of(0), model_of(1)
    assert plain.mtp is None
    names0 = [n for n, _ in plain.named_parameters()]
    names1 = [n for n, _ in with_mtp.named_parameters() if not n.startswith("mtp.")]
    assert names0 == names1 and not any("mtp" in n for n in names0)
    # init is per name: the shared parameters are bitwise the same, and so are the main logits
    state1 = with_mtp.state_dict()
    assert all(torch.equal(v, state1[k]) for k, v in plain.state_dict().items())
    tokens, mtp_tokens = tokens_and_mtp(1)
    with torch.no_grad():
        assert torch.equal(plain(tokens), with_mtp(tokens))
        assert torch.equal(plain(tokens), with_mtp(tokens, mtp_tokens=mtp_tokens)[:, :SEQ])
    assert [u.name for u in plain.fsdp_units()] == [
        u.name for u in with_mtp.fsdp_units() if "mtp" not in u.name
    ]


def test_mtp_fsdp_units_flops_and_pipeline_stage():
    model = model_of(1)
    units = model.fsdp_units()
    assert [u.name for u in units][-2:] == ["mtp.0", "mtp.0.block.moe.experts"]
    assert units[-2].block == "mtp.0" and units[-2].kind is UnitKind.DENSE
    assert units[-1].block == "mtp.0" and units[-1].kind is UnitKind.EXPERTS
    assert "mtp" in Transformer.last_stage_modules
    assert model.flops_per_token(SEQ) > model_of(0).flops_per_token(SEQ)
    # a dense MTP block (n_dense_layers beyond it) has no experts unit
    dense = model_of(1, n_dense_layers=8)
    assert [u.name for u in dense.fsdp_units()][-1] == "mtp.0"


def test_mtp_init_draws_every_parameter():
    model = model_of(1)
    m = model.mtp["0"]
    for name in ("enorm", "hnorm", "norm"):
        assert torch.equal(getattr(m, name).weight, torch.ones(64)), name
    assert 0.01 < m.eh_proj.weight.std() < 0.03  # trunc_normal(0.02)
    # the block's output projection is depth-scaled as block n_layers (4) would be: 0.02 / sqrt(10)
    assert m.block.attention.wo.weight.std() < 0.8 * model.layers["0"].attention.wo.weight.std()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_mtp_loss_reaches_the_shared_embeddings_and_head():
    model = model_of(1)
    tokens, mtp_tokens = tokens_and_mtp(1)
    labels = torch.randint(0, VOCAB, (BATCH, 2 * SEQ))
    out = model(tokens, mtp_tokens=mtp_tokens)
    F.cross_entropy(
        out[:, SEQ:].flatten(0, 1), labels[:, SEQ:].flatten()
    ).backward()  # the MTP part only
    assert model.layers["0"].attention.wo.weight.grad.abs().sum() > 0  # through h_0
    assert model.tok_embeddings.weight.grad[mtp_tokens[:, 0].unique()].abs().sum() > 0
    assert model.output.weight.grad.abs().sum() > 0
    assert (
        torch.count_nonzero(model.norm.weight.grad) == 0
    )  # the main head's norm: not in this loss
    assert all(p.grad is not None for n, p in model.mtp.named_parameters() if "experts" not in n)


# --------------------------------------------------------------------------- labels and loss


def test_shifted_labels_pad_with_the_ignore_index():
    labels = torch.tensor([[1, 2, 3, 4, 5]])
    shifted = mtp_shifted_labels(labels, 2)
    assert [s.tolist() for s in shifted] == [
        [[1, 2, 3, 4, 5]],
        [[2, 3, 4, 5, -100]],
        [[3, 4, 5, -100, -100]],
    ]


def test_prepare_builds_mtp_tokens_and_labels():
    runner = StepRunner([], torch.device("cpu"), 1, Loss(1, mtp_depth=2))
    inputs = torch.tensor([[0, 1, 2, 3, 4, 5]])
    labels = torch.tensor([[1, 2, 3, 4, 5, 6]])
    x, y, kwargs = runner.prepare(inputs, labels)
    assert torch.equal(x, inputs)
    assert y.tolist() == [[1, 2, 3, 4, 5, 6, 2, 3, 4, 5, 6, -100, 3, 4, 5, 6, -100, -100]]
    # depth k embeds token t+1+k at position t: the labels shifted by k, the ignored tail as id 0
    assert kwargs["mtp_tokens"].tolist() == [[[1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 0]]]
    assert [int(n) for n in runner.mtp_valid(labels)] == [5, 4]
    # validation scores the main head: no MTP inputs
    x, y, kwargs = runner.prepare(inputs, labels, mtp=False)
    assert torch.equal(y, labels) and kwargs == {}
    # without MTP, prepare is what it was
    x, y, kwargs = StepRunner([], torch.device("cpu"), 1).prepare(inputs, labels)
    assert torch.equal(y, labels) and kwargs == {}


def test_prepare_shards_each_part_for_context_parallel():
    seq = 8
    inputs = torch.arange(seq).unsqueeze(0)
    labels = inputs + 1
    for rank in range(2):
        cp = ContextParallel(group=None, rank=rank, degree=2)
        runner = StepRunner([], torch.device("cpu"), 1, Loss(1, mtp_depth=1), cp=cp)
        x, y, kwargs = runner.prepare(inputs, labels)
        shifted = mtp_shifted_labels(labels, 1)
        assert torch.equal(y, torch.cat([cp.shard(shifted[0]), cp.shard(shifted[1])], dim=1))
        assert torch.equal(kwargs["mtp_tokens"][:, 0], cp.shard(labels))
        # position by position, the main label, the depth-0 input and its label line up
        local = x.shape[1]
        assert torch.equal(kwargs["mtp_tokens"][:, 0], y[:, :local])
        valid = y[:, local:] != IGNORE_INDEX
        assert torch.equal(y[:, local:][valid], (x + 2)[valid])


def test_mtp_losses_main_part_is_the_plain_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(BATCH, 3 * SEQ, VOCAB, generator=g)
    labels = torch.cat(
        mtp_shifted_labels(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), 2), dim=1
    )
    valid = [(labels[:, (1 + k) * SEQ : (2 + k) * SEQ] != IGNORE_INDEX).sum() for k in range(2)]
    main, mtp = mtp_losses(logits, labels, valid, 1)
    assert torch.equal(
        main, cross_entropy_loss(logits[:, :SEQ].contiguous(), labels[:, :SEQ].contiguous())
    )
    per_depth = [
        F.cross_entropy(
            logits[:, (1 + k) * SEQ : (2 + k) * SEQ].flatten(0, 1),
            labels[:, (1 + k) * SEQ : (2 + k) * SEQ].flatten(),
        )
        for k in range(2)
    ]
    torch.testing.assert_close(mtp, (per_depth[0] + per_depth[1]) / 2, rtol=1e-6, atol=0)
    # under CP each rank's sum over the whole sequences' count, times the degree: the mean of
    # the two ranks' values is the mean over the whole sequences
    half = [
        mtp_losses(logits[:, i::2], labels[:, i::2], valid, 2)[1] for i in range(2)
    ]  # any split of positions
    torch.testing.assert_close((half[0] + half[1]) / 2, mtp, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- config


def test_mtp_depth_reaches_the_model_args():
    assert model_args("deepseek_v3", "tiny", 2000, 64, mtp_depth=1).mtp_depth == 1
    assert model_args("deepseek_v3", "tiny", 2000, 64).mtp_depth == 0
    cfg = cfg_of(DS + ["--model.mtp_depth=1", "--training.mtp_loss_weight=0.1"])
    assert (cfg.model.mtp_depth, cfg.training.mtp_loss_weight) == (1, 0.1)
    assert cfg_of([]).training.mtp_loss_weight == 0.3 and cfg_of([]).model.mtp_depth == 0


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            DS + ["--model.mtp_depth=-1"],
            "--model.mtp_depth=-1: must be >= 0 (0 = no multi-token prediction)",
        ),
        (
            ["--model.mtp_depth=1"],
            "--model.mtp_depth=1: multi-token prediction is implemented for deepseek_v3 only,"
            " not llama3; set --model.mtp_depth=0",
        ),
        (
            DS + ["--training.mtp_loss_weight=-0.5"],
            "--training.mtp_loss_weight=-0.5: must be >= 0 (0.3 in the DeepSeek-V3 report)",
        ),
    ],
)
def test_mtp_config_errors(argv, expected):
    assert config_error(argv) == expected


def test_pipeline_stages_carry_the_mtp_embeddings_to_the_last_stage():
    """Under PP the first stage embeds the MTP tokens too and every stage passes them on with
    its hidden state; the stages chained by hand give the whole model's logits bitwise."""
    from torchtitan.distributed.pipeline_layout import plan_pipeline
    from torchtitan.distributed.pipeline_parallel import split_model

    torch.manual_seed(0)
    args = dataclasses.replace(model_args("deepseek_v3", "tiny", 256, 32), mtp_depth=1)
    model = Transformer(args)
    model.init_weights(0, torch.device("cpu"))
    model.eval()
    tokens = torch.randint(0, 256, (2, 32))
    mtp_tokens = torch.randint(0, 256, (2, 1, 32))
    layout = plan_pipeline(
        args.n_layers, 2, "ZBVZeroBubble", "auto", [], n_microbatches=4
    )  # 4 stages, 1 block each
    stages = dict(part for r in range(2) for part in split_model(model, layout, r))
    carried = (tokens,)
    with torch.no_grad():
        for stage_id in range(layout.num_stages):
            out = stages[stage_id](*carried, mtp_tokens=mtp_tokens)
            carried = out if isinstance(out, tuple) else (out,)
            if (
                stage_id < layout.num_stages - 1
            ):  # (hidden state, MTP embeddings [batch, depth, seq, dim])
                assert len(carried) == 2 and carried[1].shape == (2, 1, 32, args.dim)
        whole = model(tokens, mtp_tokens=mtp_tokens)
    assert stages[0].mtp is None and stages[layout.num_stages - 1].mtp is not None
    assert torch.equal(carried[0], whole)


def test_mtp_with_pipeline_parallel_is_allowed():
    cfg, _ = load_config(
        DS
        + [
            "--model.mtp_depth=1",
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_schedule=1F1B",
        ],
        2,
    )
    assert cfg.model.mtp_depth == 1


def test_mtp_with_context_parallel_is_allowed():
    cfg, _ = load_config(DS + ["--model.mtp_depth=1", "--parallelism.context_parallel_degree=2"], 2)
    assert cfg.model.mtp_depth == 1
