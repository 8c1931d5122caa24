"""The step tail (torchtitan/training/step_tail.py) is one function that the trainer and the
memory simulation both call: what it does, in the phases of training/phases.py, and that
each caller runs it (a caller that stops calling it fails here)."""

import contextlib
import inspect
from types import SimpleNamespace as NS

import pytest
import torch
from torch import nn

from torchtitan.distributed.grad_norm import clip_grad_norm_
from torchtitan.distributed.tied_copies import TiedCopies
from torchtitan.training import step_tail as tail_module
from torchtitan.training.expert_balance import ExpertBalancer
from torchtitan.training.nonfinite import NonFiniteWatch
from torchtitan.training.optimizer import PartOptimizers
from torchtitan.training.phases import TAIL, StepPhase, label, phase_of
from torchtitan.training.step import StepResult, StepSums


def _cfg():
    return NS(
        optimizer=NS(
            name="AdamW",
            implementation="auto",
            lr=0.1,
            beta1=0.9,
            beta2=0.95,
            eps=1e-8,
            weight_decay=0.1,
        ),
        lr_scheduler=NS(warmup_steps=0, decay_ratio=0.0, decay_type="linear", min_lr_factor=0.1),
    )


def _tied_parts():
    """Two pipeline stages on one rank (as V schedules place them): the first holds the
    embedding, the last its tied copy, with different gradients."""
    torch.manual_seed(0)
    first, last = nn.Module(), nn.Module()
    first.emb = nn.Linear(4, 3, bias=False)
    last.out = nn.Linear(4, 3, bias=False)
    last.out.weight.data.copy_(first.emb.weight.data)
    first.other = nn.Linear(3, 3)
    first.tied_weights = {"out.weight": "emb.weight"}
    parts = [first, last]
    for p in (p for m in parts for p in m.parameters()):
        p.grad = torch.randn_like(p)
    return parts


def _sums(main: float = 1.5) -> StepSums:
    return StepSums(torch.tensor(main), torch.zeros(()), torch.zeros(()))


def test_phase_labels_keep_the_strings_written_to_plan_json():
    assert [p.value for p in TAIL] == [
        "tied copies",
        "replica groups",
        "clip",
        "non-finite record",
        "optimizer",
        "float8 scales",
        "expert balance",
    ]
    assert f"{StepPhase.FORWARD}" == "forward" and str(StepPhase.CLIP) == "clip"
    assert label(StepPhase.FORWARD, 1, 0) == "forward microbatch 1, stage 0"
    assert label(StepPhase.GRADIENT_REDUCTION, None, 2) == "backward (gradient reduction), stage 2"
    assert phase_of("backward (weights) microbatch 3, stage 1") is StepPhase.BACKWARD_WEIGHTS
    assert phase_of("backward microbatch 3, stage 1") is StepPhase.BACKWARD
    assert phase_of("optimizer") is StepPhase.OPTIMIZER
    with pytest.raises(ValueError):
        phase_of("forwards")


def test_the_tail_runs_its_phases_in_order_as_the_trainer_always_did():
    """Bitwise the trainer's former inline tail: tied gradients summed, the copy clipped but
    counted once in the norm, the non-finite note, the optimizer, the expert balance."""
    parts, ref_parts, cfg = _tied_parts(), _tied_parts(), _cfg()
    seen = []
    result = tail_module.step_tail(
        _sums(float("nan")),
        7,
        parts,
        PartOptimizers(parts, cfg.optimizer, 10, cfg.lr_scheduler),
        0.5,
        pp_group=None,
        nonfinite=(watch := NonFiniteWatch(torch.device("cpu"))),
        tied=TiedCopies(parts, None),
        balancer=ExpertBalancer(parts, torch.device("cpu"), None),  # no MoE: the load figure only
        on_phase=seen.append,
    )
    # no float8 all-gather, no replica groups
    assert seen == [p for p in TAIL if p not in (StepPhase.FLOAT8_SCALES, StepPhase.REPLICA_GROUPS)]
    assert isinstance(result, StepResult) and result.load.tolist() == [-float("inf")] * 2
    assert watch.first_step() == (7, "loss", pytest.approx(float("nan"), nan_ok=True))

    # the same steps written out, on a copy
    tied = TiedCopies(ref_parts, None)
    tied.sum_gradients()
    params = [p for m in ref_parts for p in m.parameters()]
    copies = [p for p in params if id(p) in tied.copies()]
    norm = clip_grad_norm_(
        [p for p in params if id(p) not in tied.copies()], 0.5, None, also_clip=copies
    )
    PartOptimizers(ref_parts, cfg.optimizer, 10, cfg.lr_scheduler).step()
    assert torch.equal(result.grad_norm, norm)
    for got, want in zip(
        (p for m in parts for p in m.parameters()), (p for m in ref_parts for p in m.parameters())
    ):
        assert torch.equal(got, want) and torch.equal(got.grad, want.grad)
    assert torch.equal(parts[0].emb.weight, parts[1].out.weight)  # the copies stay one weight


def test_without_tied_copies_or_experts_their_phases_are_skipped():
    parts, cfg = _tied_parts(), _cfg()
    seen = []
    result = tail_module.step_tail(
        _sums(),
        1,
        parts,
        PartOptimizers(parts, cfg.optimizer, 10, cfg.lr_scheduler),
        0.0,
        pp_group=None,
        nonfinite=NonFiniteWatch(torch.device("cpu")),
        on_phase=seen.append,
    )
    assert seen == [StepPhase.CLIP, StepPhase.NONFINITE, StepPhase.OPTIMIZER]
    assert result.load is None


def test_the_trainer_runs_the_step_tail(monkeypatch):
    """Trainer.train_step hands its forward/backward's sums and its own tail parts to
    step_tail (monkeypatch raises if train.py no longer imports it; the spy is not called if
    it no longer calls it)."""
    from torchtitan import train

    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return "tail result"

    monkeypatch.setattr(train, "step_tail", spy)
    sums = _sums()
    parts = _tied_parts()
    trainer = NS(
        comm=None,
        runner=NS(forward_backward=lambda batches: sums, held_bytes=0, pipeline=object()),
        dims=NS(pp_group=lambda: "pp group"),
        model_parts=parts,
        optimizers="optimizers",
        cfg=NS(training=NS(max_norm=1.0)),
        nonfinite="nonfinite",
        tied="tied",
        balancer="balancer",
        float8_scales=False,
        replicas="replicas",
    )
    assert train.Trainer.train_step(trainer, [], 3) == "tail result"
    ((args, kwargs),) = calls
    assert _bound(args, kwargs) == {
        "sums": sums,
        "step": 3,
        "model_parts": parts,
        "optimizers": "optimizers",
        "max_norm": 1.0,
        "pp_group": "pp group",
        "nonfinite": "nonfinite",
        "tied": "tied",
        "balancer": "balancer",
        "float8_scales": False,
        "replicas": "replicas",
    }


@pytest.mark.parametrize("committed", [True, False])
def test_replica_groups_average_before_the_clip_and_an_uncommitted_step_is_not_taken(committed):
    """Fault tolerance: the gradients (and loss sums) are averaged over the replica groups
    before the norm; a step torchft does not commit leaves weights and schedule as they were."""
    parts, cfg = _tied_parts(), _cfg()
    before = [p.detach().clone() for m in parts for p in m.parameters()]
    calls = []

    class Replicas:
        def average(self, params, sums):
            calls.append(("average", len(params), sums.main.item()))
            for p in params:
                p.grad.mul_(0.5)

        def commit(self):
            calls.append(("commit",))
            return committed

        def stepping(self):
            calls.append(("stepping",))
            return contextlib.nullcontext()

    optimizers = PartOptimizers(parts, cfg.optimizer, 10, cfg.lr_scheduler)
    seen = []
    result = tail_module.step_tail(
        _sums(),
        1,
        parts,
        optimizers,
        0.0,
        pp_group=None,
        nonfinite=NonFiniteWatch(torch.device("cpu")),
        replicas=Replicas(),
        on_phase=seen.append,
    )
    n = sum(1 for m in parts for _ in m.parameters())
    # the optimizers step inside the groups' context (a semi-synchronous sync runs there)
    assert calls == [("average", n, 1.5), ("commit",)] + [("stepping",)] * committed
    assert seen[:2] == [StepPhase.REPLICA_GROUPS, StepPhase.CLIP]
    assert result.committed is committed
    grads = torch.cat([p.grad.reshape(-1) for m in parts for p in m.parameters()])
    assert torch.equal(result.grad_norm, grads.norm())  # the norm of the averaged gradients
    after = [p.detach() for m in parts for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)) is not committed
    assert (optimizers.schedulers[0].last_epoch == 1) is committed


def _bound(args, kwargs) -> dict:
    """A call's arguments by step_tail's parameter names."""
    return dict(inspect.signature(tail_module.step_tail).bind(*args, **kwargs).arguments)


def _simulated_tail(monkeypatch, argv: list[str], world: int, pp_rank: int):
    """The tail calls of one simulated step (fake tensors), with the phases they announced."""
    from torchtitan.checks import load_config
    from torchtitan.planning.simulate import step as simulate_step
    from torchtitan.planning.simulate.patches import PipelineStartup
    from torchtitan.training.build import fake_world
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    calls = []

    def spy(*args, on_phase=None, **kwargs):
        phases = []
        calls.append((_bound(args, kwargs), phases))

        def told(phase):
            phases.append(phase)
            on_phase(phase)  # the simulation's tracker labels its storages with it

        return tail_module.step_tail(*args, on_phase=told, **kwargs)

    monkeypatch.setattr(simulate_step, "step_tail", spy)
    cfg, _ = load_config(["--training.seq_len=32", "--training.local_batch_size=2", *argv], world)
    with fake_world(cfg, world) as dims:
        job = PlannedJob(cfg, model_on_meta(cfg), dims, "cpu")
        simulate_step.simulate_pp_rank(job, pp_rank, PipelineStartup())
    return calls


def test_the_simulation_runs_the_trainers_tail_with_the_tied_copies(monkeypatch):
    """The first pipeline stage of a tied Qwen3: the embedding's gradient summed with its
    copy's on the last stage, as in training, then clipping, the non-finite record and the
    optimizer."""
    calls = _simulated_tail(
        monkeypatch,
        ["--model.name=qwen3", "--model.flavor=tiny", "--parallelism.pipeline_parallel_degree=2"],
        2,
        0,
    )
    ((bound, phases),) = calls
    tied = bound["tied"]
    assert isinstance(bound["nonfinite"], NonFiniteWatch) and bound["step"] == 2
    assert isinstance(tied, TiedCopies) and tied.pairs and bound.get("balancer") is None
    assert phases == [
        StepPhase.TIED_COPIES,
        StepPhase.CLIP,
        StepPhase.NONFINITE,
        StepPhase.OPTIMIZER,
    ]


def test_the_simulation_runs_the_trainers_tail_with_the_expert_balance(monkeypatch):
    calls = _simulated_tail(
        monkeypatch,
        [
            "--model.name=qwen3",
            "--model.flavor=tiny_moe",
            "--parallelism.expert_parallel_degree=2",
        ],
        2,
        0,
    )
    ((bound, phases),) = calls
    balancer = bound["balancer"]
    assert bound.get("tied") is None and isinstance(balancer, ExpertBalancer) and balancer.moes
    assert phases == [
        StepPhase.CLIP,
        StepPhase.NONFINITE,
        StepPhase.OPTIMIZER,
        StepPhase.EXPERT_BALANCE,
    ]


def test_a_float8_all_gather_job_is_simulated_with_precomputed_scales(monkeypatch):
    """FSDP2's float8 all-gather with precomputed scales: the simulated step is step 2, so its
    gathers cast with the scales step 1's tail computed; the simulation runs that precompute
    before the step (else every gathered weight would add an amax all-reduce in forward and
    backward, which the published 128-GPU row showed: -17.4% instead of -7.1%), and again in
    the step's own tail."""
    from torchtitan.planning.simulate import step as simulate_step

    calls = []
    original = simulate_step.precompute_scales

    def spy(parts):
        calls.append(len(parts))
        original(parts)

    monkeypatch.setattr(simulate_step, "precompute_scales", spy)
    key = "--quantize.linear.float8"
    runs = _simulated_tail(
        monkeypatch,
        [
            "--model.flavor=tiny",
            "--model.converters=quantize.linear.float8",
            f"{key}.filter_fqns=output",
            f"{key}.enable_fsdp_float8_all_gather=true",
            f"{key}.precompute_float8_dynamic_scale_for_fsdp=true",
        ],
        2,
        0,
    )
    ((bound, phases),) = runs
    assert bound["float8_scales"] is True
    assert StepPhase.FLOAT8_SCALES in phases
    assert calls == [1]  # before the step; the tail's own runs inside step_tail


def test_the_simulation_runs_the_replica_groups_buckets_of_a_fault_tolerant_job(monkeypatch):
    """Under fault tolerance the simulated step makes the trainer's bucket copies
    (fault_tolerance.in_buckets) in its tail, so the memory prediction holds them."""
    from torchtitan.training.fault_tolerance import PlannedReplicaGroups

    ft = ["--job.dry_run=true", "--fault_tolerance.enable", "--fault_tolerance.group_size=2"]
    ((args, phases),) = _simulated_tail(monkeypatch, ["--model.flavor=tiny", *ft], 2, 0)
    assert isinstance(args["replicas"], PlannedReplicaGroups)
    assert phases.index(StepPhase.REPLICA_GROUPS) < phases.index(StepPhase.CLIP)
    ((args, phases),) = _simulated_tail(monkeypatch, ["--model.flavor=tiny"], 2, 0)
    assert args.get("replicas") is None and StepPhase.REPLICA_GROUPS not in phases
