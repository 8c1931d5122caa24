"""MFU inputs: the measured MFU's peak from the hardware table (exact names, form factors) and
the FLOP count convention; the memory keys."""

import pytest
import torch

from torchtitan.hardware import measured_peak_tflops
from torchtitan.observe.metrics import memory_stats, peak_tflops


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # SXM
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", 989.4),
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA H800", 989.4),
        ("NVIDIA GH200 480GB", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),  # not B200's: whole words, not substrings
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40", 181.05),  # not L4's figure
        ("NVIDIA L40S", 362.05),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A10G", None),  # not A10's datasheet part: unknown rather than wrong
        ("NVIDIA GeForce RTX 4090", None),
        ("Tesla V100-SXM2-32GB", None),
    ],
)
def test_peak_tflops_by_exact_device_name(name, tflops):
    assert measured_peak_tflops(name) == tflops


def test_measured_peak_follows_the_configured_key_and_profile():
    cpu = torch.device("cpu")
    assert peak_tflops(cpu, "auto") is None  # no measured MFU on CPU
    assert peak_tflops(cpu, 312.0) == 312.0  # --hardware.peak_tflops wins everywhere
    # a named profile is the figure whatever the GPU's name says (the predicted MFU's too)
    assert measured_peak_tflops("NVIDIA A10G", "l40s") == 362.05
    assert measured_peak_tflops("NVIDIA A10G", "local") is None  # local: the name decides


def test_llama3_8b_flops_follow_torchtitans_convention():
    from torchtitan.models.flavors import flavors_of
    from torchtitan.models.llama3.model import Transformer

    args = flavors_of("llama3")["8B"]
    with torch.device("meta"):
        model = Transformer(args)
    n = sum(p.numel() for p in model.parameters())
    assert n == 8_030_261_248  # the published 8B
    seq = 8192
    # 6 N (without the embedding) + 12 * layers * heads * head_dim * seq, no causal halving
    expected = 6 * (n - 128256 * 4096) + 12 * 32 * 32 * 128 * seq
    assert model.flops_per_token(seq) == expected


def test_cpu_memory_is_the_resident_set_under_its_own_key():
    stats = memory_stats(torch.device("cpu"))
    assert list(stats) == ["memory_rss_gib"] and 0.01 < stats["memory_rss_gib"] < 64


def test_llama_3_2_flavors_have_the_published_shapes():
    from torchtitan.models.flavors import flavors_of
    from torchtitan.models.llama3.model import Transformer

    for flavor, published in (
        ("1B", 1_235_814_400),
        ("3B", 3_212_749_824),
    ):  # Hugging Face counts, tied output
        args = flavors_of("llama3")[flavor]
        assert args.ffn_hidden_dim == 8192 and args.rope_factor == 32.0
        with torch.device("meta"):
            model = Transformer(args)
        untied = sum(p.numel() for p in model.parameters())
        assert untied - model.output.weight.numel() == published, (flavor, untied)


# --------------------------------------------------------------------------- scalar sinks (TensorBoard, W&B)


class _FakeRun:
    def __init__(self, **kwargs):
        self.init, self.logged, self.finished = kwargs, [], []

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def finish(self, exit_code=0):
        self.finished.append(exit_code)

    def mark_preempting(self):
        self.finished.append("preempting")


class _RecordingSink:
    def __init__(self):
        self.written, self.closed = [], []

    def write(self, step, scalars):
        self.written.append((step, dict(scalars)))

    def close(self, failed=False, preempted=False):
        self.closed.append(failed)


@pytest.fixture
def fake_wandb(monkeypatch):
    """wandb replaced by a stand-in whose init() returns a run recording what it gets."""
    import sys
    import types

    runs = []
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: runs.append(_FakeRun(**kwargs)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    for var in ("WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)
    return runs


STEP_VALUES = {
    "loss": 2.5,
    "grad_norm": 0.5,
    "lr": 1e-3,
    "tokens_per_sec": 100.0,
    "tokens_per_sec_per_device": 50.0,
    "mfu": None,
    "memory_rss_gib": 0.4,
    "step_time": 0.1,
    "tokens_seen": 64,
    "expert_load_min": 0.5,
    "expert_load_max": 1.5,
    "mtp_loss": 2.75,
    "comm": {"forward/all_gather/dp": 2},
}


def test_wandb_gets_what_tensorboard_gets(tmp_path, fake_wandb):
    from torchtitan.observe.metrics import MetricsLogger, TensorBoardSink, WandbSink

    config = {"job": {"description": ""}, "training": {"steps": 2}}
    with MetricsLogger(
        str(tmp_path / "run"), enabled=True, tensorboard=True, total_steps=2, wandb_config=config
    ) as logger:
        assert [type(s) for s in logger.sinks] == [TensorBoardSink, WandbSink]
        (run,) = fake_wandb
        assert run.init == {
            "project": "torchtitan",
            "entity": None,
            "name": "run",
            "dir": str(tmp_path / "run"),
            "config": config,
        }
        recorder = _RecordingSink()
        logger.sinks.append(recorder)  # sees what every sink is given
        logger.log(1, STEP_VALUES)
        logger.log_validation(
            2, {"validation_loss": 2.0, "validation_perplexity": 7.39}, batches=1, seconds=0.2
        )
    numbers = {
        k: v for k, v in STEP_VALUES.items() if k not in ("mfu", "comm")
    }  # not numbers: no scalar
    expected = [(1, numbers), (2, {"validation_loss": 2.0, "validation_perplexity": 7.39})]
    assert run.logged == recorder.written == expected
    assert run.finished == [0] and recorder.closed == [False]
    logger.close()  # closing twice finishes once
    assert run.finished == [0]


def test_wandb_run_failed_when_training_raises(tmp_path, fake_wandb, monkeypatch):
    from torchtitan.observe.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_PROJECT", "proj")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    with pytest.raises(RuntimeError, match="boom"):
        with MetricsLogger(
            str(tmp_path),
            enabled=True,
            tensorboard=False,
            total_steps=2,
            wandb_config={},
            run_name="my run",
        ) as logger:
            logger.log(1, STEP_VALUES)
            raise RuntimeError("boom")
    (run,) = fake_wandb
    assert (run.init["project"], run.init["entity"], run.init["name"]) == ("proj", "team", "my run")
    assert run.finished == [1] and [step for step, _ in run.logged] == [1]


def test_no_wandb_run_off_or_off_rank_0(tmp_path, fake_wandb):
    from torchtitan.observe.metrics import MetricsLogger

    MetricsLogger(str(tmp_path / "a"), enabled=True, tensorboard=False, total_steps=1).close()
    MetricsLogger(
        str(tmp_path / "b"), enabled=False, tensorboard=True, total_steps=1, wandb_config={}
    ).close()
    assert fake_wandb == []


def test_a_preempted_run_ends_its_wandb_run_preempted(tmp_path, fake_wandb):
    from torchtitan.observe.metrics import MetricsLogger

    with MetricsLogger(
        str(tmp_path / "run"), enabled=True, tensorboard=False, total_steps=4, wandb_config={}
    ) as logger:
        logger.log(1, STEP_VALUES)
        logger.preempted = True  # the trainer sets it when the ranks stopped for a signal
    (run,) = fake_wandb
    assert run.finished == ["preempting", 75]
