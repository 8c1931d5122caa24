"""optimizer.name = Muon (training/muon.py) on one rank: bitwise torch.optim.Muon's update with
bfloat16 Newton-Schulz; the float32 iteration against one written out here; the lr adjusted
from the matrix's global shape; which parameters each optimizer takes; each bad input's line.
The layouts against one rank: the parity suite's muon_* cases (muon_cases.py)."""

import math

import pytest
import torch
from config_helpers import cfg_of, config_error

from torchtitan.training.muon import (
    Muon,
    MuonAndAdamW,
    adjusted_lr,
    cpu_has_bf16_gemm,
    newton_schulz,
    split,
)
from torchtitan.training.optimizer import PartOptimizers


def _opt_cfg(**kw):
    cfg = cfg_of(["--optimizer.name=Muon", *[f"--optimizer.{k}={v}" for k, v in kw.items()]])
    return cfg.optimizer


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_one_rank_muon_is_torchs_bitwise(adjust):
    torch.manual_seed(0)
    shapes = [(16, 8), (8, 24), (12, 12)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    cfg = _opt_cfg(muon_lr=0.02, muon_adjust_lr_fn=adjust)
    a = Muon(ours, cfg)
    b = torch.optim.Muon(theirs, lr=0.02, adjust_lr_fn=adjust)  # torch's defaults otherwise
    for _ in range(5):
        grads = [torch.randn(s) for s in shapes]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
        assert torch.equal(a.state[p]["momentum_buffer"], b.state[q]["momentum_buffer"])


def test_float32_newton_schulz_matches_the_quintic_written_out():
    """X <- a X + b (X X^T) X + c (X X^T)^2 X, from X = G / |G|_F on the wide side."""
    torch.manual_seed(1)
    g = torch.randn(24, 10, dtype=torch.float64)
    a, b, c = 3.4445, -4.775, 2.0315
    x = g.T / g.norm()
    for _ in range(5):
        m = x @ x.T
        x = a * x + b * (m @ x) + c * (m @ m @ x)
    want = x.T
    got = newton_schulz(g.float(), (a, b, c), 5, 1e-7, torch.float32)
    assert torch.allclose(got.double(), want, atol=1e-5)
    # near-orthogonal columns (the quintic leaves singular values in about 0.7-1.2)
    s = torch.linalg.svdvals(got)
    assert s.min() > 0.5 and s.max() < 1.5


def test_the_lr_is_adjusted_by_the_global_shape():
    assert adjusted_lr(0.02, "original", (4096, 1024)) == pytest.approx(0.02 * 2)
    assert adjusted_lr(0.02, "original", (1024, 4096)) == 0.02
    assert adjusted_lr(0.02, "match_rms_adamw", (1024, 4096)) == pytest.approx(0.02 * 0.2 * 64)
    # a DTensor's .shape is the global one: Muon reads p.shape, never the local shard's


def test_the_split_gives_muon_the_hidden_matrices():
    def named(*names_shapes):
        return [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in names_shapes]

    params = named(
        ("tok_embeddings.weight", (32, 8)),
        ("layers.0.attention.wq.weight", (8, 8)),
        ("layers.0.attention_norm.weight", (8,)),
        ("layers.0.moe.router.gate.weight", (4, 8)),
        ("layers.0.moe.experts.w1", (4, 8, 16)),
        ("layers.0.feed_forward.w2.weight", (8, 16)),
        ("output.weight", (32, 8)),
    )
    muon, adamw = split(params, _opt_cfg())
    assert [n for n, _ in muon] == [
        "layers.0.attention.wq.weight",
        "layers.0.moe.experts.w1",
        "layers.0.feed_forward.w2.weight",
    ]
    assert len(adamw) == 4
    moved = _opt_cfg(adamw_params='["*.wq.weight", "*.experts.*"]', muon_params='["output.weight"]')
    muon, _ = split(params, moved)
    assert [n for n, _ in muon] == ["layers.0.feed_forward.w2.weight", "output.weight"]


def test_a_stack_of_expert_matrices_steps_as_torchs_muon_per_matrix():
    """Routed experts' (experts, rows, cols) weight: each expert's matrix updated bitwise as
    torch.optim.Muon updates it alone (batched GEMMs, the lr of one expert's shape)."""
    torch.manual_seed(3)
    stack = torch.nn.Parameter(torch.randn(4, 16, 8))
    alone = [torch.nn.Parameter(m.detach().clone()) for m in stack]
    a = Muon([stack], _opt_cfg(muon_lr=0.02))
    b = torch.optim.Muon(alone, lr=0.02)
    for _ in range(3):
        g = torch.randn(4, 16, 8)
        stack.grad = g.clone()
        for q, gq in zip(alone, g):
            q.grad = gq.clone()
        a.step()
        b.step()
    assert torch.equal(stack.detach(), torch.stack([q.detach() for q in alone]))
    mom = torch.stack([b.state[q]["momentum_buffer"] for q in alone])
    assert torch.equal(a.state[stack]["momentum_buffer"], mom)


def test_part_optimizers_step_muon_and_adamw_and_print_the_split():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    cfg = cfg_of(["--optimizer.name=Muon", "--lr_scheduler.warmup_steps=0"])
    opt = PartOptimizers([model], cfg.optimizer, 10, cfg.lr_scheduler)
    (part,) = opt.optimizers
    assert isinstance(part, MuonAndAdamW) and [type(o).__name__ for o in part] == ["Muon", "AdamW"]
    assert len(opt.schedulers) == 2
    line = opt.split_line()
    assert line.startswith(
        "[torchtitan] optimizer: Muon for 1 matrices (64 parameters on this rank), AdamW for 3"
    )
    assert "Muon orthogonalizes (owner): 1 whole where they are (no exchange)" in line
    # bfloat16 Newton-Schulz on a CPU without bf16 GEMMs: said at start
    assert ("no bf16 instructions" in line) == (not cpu_has_bf16_gemm())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    assert set(part.state) == set(model.parameters())
    assert "momentum_buffer" in part.state[model[0].weight]
    assert "exp_avg" in part.state[model[0].bias]


TINY = ["--model.flavor=tiny", "--training.device=cpu", "--optimizer.name=muon"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ['--optimizer.muon_params=["layers.*.attention_norm.weight"]'],
            "--optimizer.muon_params: layers.0.attention_norm.weight is 1-D (64,); Muon takes"
            " matrices only (2-D, or 3-D stacks of them): drop it from the patterns",
        ),
        (
            ['--optimizer.adamw_params=["nothing.*"]'],
            "--optimizer.adamw_params: 'nothing.*' matches no parameter of the model (e.g."
            " tok_embeddings.weight, layers.2.attention_norm.weight); fix the pattern",
        ),
        (
            ["--optimizer.muon_ns_coefficients=[1.0,2.0]"],
            "--optimizer.muon_ns_coefficients=[1.0, 2.0]: give the quintic's 3 coefficients"
            " (a, b, c), e.g. [3.4445, -4.775, 2.0315]",
        ),
        (
            ["--optimizer.muon_adjust_lr_fn=foo"],
            "--optimizer.muon_adjust_lr_fn: invalid value 'foo'; choose one of 'original',"
            " 'match_rms_adamw'",
        ),
        (
            ["--optimizer.early_step_in_backward"],
            "--optimizer.early_step_in_backward with --optimizer.name=muon: Muon orthogonalizes"
            " each whole matrix after the step's gradients are reduced; turn"
            " early_step_in_backward off",
        ),
    ],
)  # fmt: skip
def test_bad_muon_input_is_one_line(argv, expected):
    assert config_error([*TINY, *argv], 1) == expected


def test_muon_lr_default_is_torchs():
    o = _opt_cfg()
    assert (o.muon_lr, o.muon_momentum, o.muon_weight_decay, o.muon_ns_steps) == (
        1e-3,
        0.95,
        0.1,
        5,
    )
    assert o.muon_ns_coefficients == [3.4445, -4.775, 2.0315] and o.ns_dtype == "bfloat16"
    assert math.isclose(o.muon_eps, 1e-7)
