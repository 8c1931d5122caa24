"""Float8 training's collectives, counted per step on CPU ranks (gloo): FSDP2's float8
all-gather moves 1 byte per converted weight element instead of the parameter dtype's, with
one amax all-reduce per step when the scales are precomputed (one per gathered weight and
gather otherwise), and leaves the losses bitwise as they were; SimpleFSDP gathers in the
parameter dtype (its float8 all-gather is refused before launch); tensor parallel's float8
styles gather each block's input in float8."""

import json

import pytest
import run_tests

from torchtitan.config.manager import build_config
from torchtitan.models.common.float8 import is_float8_linear
from torchtitan.training.planned_job import model_on_meta

STEPS = 2
RUN = [
    "--model.flavor=tiny",
    f"--training.steps={STEPS}",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.global_batch_size=8",
    "--training.deterministic=true",
    "--metrics.comm_stats=true",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
]
F8 = ["--model.converters=quantize.linear.float8", "--quantize.linear.float8.filter_fqns=output"]
KEY = "--quantize.linear.float8"
ALL_GATHER = f"{KEY}.enable_fsdp_float8_all_gather=true"
PRECOMPUTE = f"{KEY}.precompute_float8_dynamic_scale_for_fsdp=true"
BF16 = "--training.mixed_precision_param=bfloat16"


def _run(ngpu: int, args: list[str], dump) -> list[dict]:
    rc, _, out = run_tests.launch(
        ngpu, [*RUN, *args, f"--job.dump_folder={dump}"], str(dump / "ranks")
    )
    assert rc == 0, out[-3000:]
    return [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]


def _numel() -> tuple[int, int, int]:
    """(all parameters, converted weights, converted linears) of the tiny model."""
    cfg, _ = build_config(["--model.flavor=tiny", *F8])
    model = model_on_meta(cfg).model
    f8 = [m for m in model.modules() if is_float8_linear(m)]
    return sum(p.numel() for p in model.parameters()), sum(m.weight.numel() for m in f8), len(f8)


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("float8_fsdp")
    runs = {
        "bf16": [BF16, *F8],
        "all_gather": [BF16, *F8, ALL_GATHER],
        "precomputed": [BF16, *F8, ALL_GATHER, PRECOMPUTE],
        "simple_fsdp": [BF16, *F8, "--parallelism.fsdp_implementation=simple_fsdp"],
        "fp32": [*F8],
        "fp32_all_gather": [*F8, ALL_GATHER, PRECOMPUTE],
    }
    return {name: _run(2, args, base / name) for name, args in runs.items()}


def test_fsdp2_float8_all_gather_moves_one_byte_per_converted_element(fsdp_runs):
    n, n8, linears = _numel()
    micro = 2  # accumulation steps per optimizer step: global 8 = local 2 x 2 ranks x 2
    bf16, f8, pre = (fsdp_runs[k][-1] for k in ("bf16", "all_gather", "precomputed"))
    gathered = "forward/all_gather/dp_shard"
    assert bf16["comm_bytes"][gathered] == micro * 2 * n  # every parameter, bf16, per microstep
    assert f8["comm_bytes"][gathered] == micro * (2 * n - n8)  # converted weights: 1 byte
    assert pre["comm_bytes"][gathered] == f8["comm_bytes"][gathered]
    # the scales: an amax all-reduce per gathered weight and gather, or one per step
    assert f8["comm"]["forward/all_reduce/dp_shard"] == micro * linears
    assert "forward/all_reduce/dp_shard" not in pre["comm"]
    assert "backward/all_reduce/dp_shard" not in pre["comm"]
    other = "other/all_reduce/dp_shard"  # the loss / norm's, plus the precomputed amaxes
    assert pre["comm"][other] == bf16["comm"][other] + 1
    assert pre["comm_bytes"][other] == bf16["comm_bytes"][other] + 4 * linears  # fp32 amaxes
    # precomputing changes when the scales are computed, not their values
    assert [r["loss"] for r in fsdp_runs["precomputed"]] == [
        r["loss"] for r in fsdp_runs["all_gather"]
    ]


def _figures(records: list[dict]) -> list[tuple[float, float]]:
    return [(r["loss"], r["grad_norm"]) for r in records]


def test_the_float8_all_gather_leaves_fp32_losses_bitwise(fsdp_runs):
    """fp32 weights: the gathered float8 weight is the cast of the same fp32 values with the
    same (global amax) scale, so every figure is bitwise the same. With bf16 parameters it is
    not: the plain path rounds fp32 -> bf16 -> float8, the float8 all-gather fp32 -> float8."""
    assert _figures(fsdp_runs["fp32_all_gather"]) == _figures(fsdp_runs["fp32"])
    assert _figures(fsdp_runs["all_gather"]) != _figures(fsdp_runs["bf16"])


def test_simple_fsdp_gathers_float8_weights_in_the_parameter_dtype(fsdp_runs):
    """SimpleFSDP's float8 all-gather is refused before launch (test_float8.py): without it,
    its gathers move what FSDP2's plain ones move, every parameter in bf16."""
    n, _, _ = _numel()
    simple, fsdp2 = (fsdp_runs[k][-1]["comm_bytes"] for k in ("simple_fsdp", "bf16"))
    assert (
        simple["forward/all_gather/dp_shard"] == fsdp2["forward/all_gather/dp_shard"] == 2 * 2 * n
    )


def test_tensor_parallel_gathers_block_inputs_in_float8(tmp_path):
    """Sequence parallel gathers each block's attention and feed-forward input over TP: in
    float8 (1 byte per element, cast before the gather) with the tensorwise recipe; the output
    head, kept in high precision, gathers its input in fp32."""
    tp = "--parallelism.tensor_parallel_degree=2"
    plain = _run(2, [tp], tmp_path / "fp32")[-1]
    f8 = _run(2, [tp, *F8], tmp_path / "float8")[-1]
    micro, blocks, tokens, dim = 4, 4, 2 * 64, 64  # local batch 2 x 4 accumulation steps
    gathers = micro * blocks * 2  # attention and feed-forward inputs
    key = "forward/all_gather/tp"
    assert f8["comm"][key] == plain["comm"][key]
    assert plain["comm_bytes"][key] - f8["comm_bytes"][key] == gathers * tokens * dim * (4 - 1)


def test_float8_checkpoints_hold_high_precision_weights_resume_bitwise_and_load_without_it(
    tmp_path,
):
    """FSDP2 with the float8 all-gather and precomputed scales: the step-5 checkpoint resumes
    bitwise (the scales are recomputed from the loaded weights), holds the weights in the
    parameter dtype, exports to Hugging Face with the names and dtypes of a plain run, and
    trains on in a run without float8."""
    import shutil

    import checkpoint_checks as cc
    from safetensors.torch import load_file

    ckpt = ["--checkpoint.enable=true", "--checkpoint.interval=5"]
    job = [*F8, ALL_GATHER, PRECOMPUTE, *ckpt, "--checkpoint.last_save_in_hf=true"]
    steps = ["--training.steps=10"]
    dump = tmp_path / "float8"
    straight = _run(2, [*job, *steps], dump)
    _run(1, [*ckpt, "--checkpoint.last_save_in_hf=true", "--training.steps=5"], tmp_path / "plain")

    # the Hugging Face export: a plain run's tensors, names and dtypes
    def tensors(folder) -> dict:
        return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}

    f8_hf = tensors(dump / "hf" / "step-10")
    plain_hf = tensors(tmp_path / "plain" / "hf" / "step-5")
    assert len(f8_hf) == len(plain_hf) > 0
    assert {k: (v.dtype, v.shape) for k, v in f8_hf.items()} == {
        k: (v.dtype, v.shape) for k, v in plain_hf.items()
    }
    assert all(v.dtype == plain_hf[k].dtype for k, v in f8_hf.items())
    # bitwise resume from step 5
    shutil.rmtree(dump / "checkpoint" / "step-10")
    shutil.rmtree(dump / "hf")
    resumed = _run(2, [*job, *steps], dump)
    assert [(r["loss"], r["grad_norm"]) for r in resumed if r["step"] > 5] == [
        (r["loss"], r["grad_norm"]) for r in straight if r["step"] > 5
    ]
    # the step-5 checkpoint trains on without float8 (a plain fp32 run, TP 2)
    other = tmp_path / "without_float8"
    got, log = cc.layout_change(str(dump), "fsdp+tp", str(other))
    assert "checkpoint: resumed from step 5" in log
    f8_losses = {r["step"]: r["loss"] for r in straight}
    assert sorted(got) == list(range(6, 11))
    assert abs(got[6] - f8_losses[6]) <= 2e-3 * f8_losses[6]  # only float8's rounding apart
