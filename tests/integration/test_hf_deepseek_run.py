"""DeepSeek-V3 Hugging Face folders through real runs (tiny: 4 blocks, 3 MoE with 8 experts).

A 1-rank run exports its last step (--checkpoint.last_save_in_hf) beside its DCP checkpoint;
that folder starts FSDP2+EP2 with each rank reading only its experts and its FSDP rows (the
fast case, in `make test`); with --slow it also starts 1 rank, PP2+EP2 and TP2+EP2 with the
same first loss, the 1-rank start trains bitwise as the start from the DCP checkpoint of the
same step, and scripts/convert_hf.py turns the folder into a model-only DCP step folder and
back to bitwise the same tensors (and a run from that DCP folder starts with the same loss).

Run with -s to see the tables (first losses per layout, bytes read per rank)."""

import glob
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import run_tests

DS = "deepseek_v3"
EP = "--parallelism.expert_parallel_degree=2"
PP = "--parallelism.pipeline_parallel_degree=2"
TP = "--parallelism.tensor_parallel_degree=2"
# First-step losses of every layout vs the 1-rank start: relative difference at most this
# (fp32; the layouts sum the same products in another order). Measured: bitwise equal.
FIRST_LOSS_RTOL = 1e-6
LOADED = re.compile(
    r"weights loaded from Hugging Face folder (\S+) \((\d+) tensors, ([0-9.]+) MiB read on this rank\)"
)
EXPERT_STACK = re.compile(r"(^|\.)layers\.\d+\.moe\.experts\.w[123]$")


@dataclass
class Export:
    src: str  # the export run's dump folder
    hf: str  # <src>/hf/step-2
    dcp: str  # <src>/checkpoint/step-2
    secs: float


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Export:
    """(a) 1 rank trains 2 steps, checkpoints, and exports step 2 as a Hugging Face folder."""
    src = str(tmp_path_factory.mktemp("deepseek_hf") / "src")
    rc, secs, out = run_tests.run(
        1,
        ["--training.steps=2", "--checkpoint.enable=true", "--checkpoint.last_save_in_hf=true"],
        src,
        model=DS,
    )
    assert rc == 0, out[-3000:]
    hf, dcp = os.path.join(src, "hf", "step-2"), os.path.join(src, "checkpoint", "step-2")
    assert f"Hugging Face folder written to {hf}" in out, out[-3000:]
    files = sorted(os.listdir(hf))
    assert files == [
        "config.json",
        "model-pp00-0000.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ], files
    assert json.load(open(os.path.join(hf, "config.json")))["model_type"] == "deepseek_v3"
    marker = json.load(open(os.path.join(dcp, ".complete")))
    assert (
        marker["step"] == 2 and not marker["model_only"] and marker["model"] == "deepseek_v3/tiny"
    ), marker
    return Export(src, hf, dcp, secs)


@dataclass
class Start:
    losses: list[float]
    grad_norms: list[float]
    out: str
    dump: str
    secs: float


def _start(dump: str, ngpu: int, path: str, overrides=(), steps: int = 1) -> Start:
    """A run of `steps` steps from `path` (Hugging Face or DCP folder); every rank logs."""
    rc, secs, out = run_tests.run(
        ngpu,
        [f"--training.steps={steps}", f"--checkpoint.initial_load_path={path}", *overrides],
        dump,
        model=DS,
        extra_env={"LOG_RANK": ",".join(map(str, range(ngpu)))},
    )
    assert rc == 0, out[-3000:]
    return Start(run_tests.read_losses(dump), run_tests.read_grad_norms(dump), out, dump, secs)


def _rank_reads(dump: str, ngpu: int) -> dict[int, float]:
    """rank -> MiB it read, from its own log line."""
    reads = {}
    for rank in range(ngpu):
        with open(os.path.join(dump, "ranks", str(rank), "stdout.log")) as f:
            found = LOADED.findall(f.read())
        assert len(found) == 1, (rank, found)
        reads[rank] = float(found[0][2])
    return reads


def _expected_fsdp_ep_bytes(
    hf: str, rank: int, dp_shard: int = 2, ep: int = 2
) -> tuple[int, int, int]:
    """(expert bytes, other bytes, folder bytes) rank `rank` of FSDP2 x EP reads: the routed-expert
    stacks [E, ., .] are split by expert over EP (their FSDP mesh, dp_shard / ep, is 1 here), every
    other parameter is FSDP2's dim-0 chunk `rank` of dp_shard (torch.chunk sizes), the experts' bias
    buffers are read whole. Element sizes are the folder's (its dtype)."""
    import torch

    from torchtitan.models.flavors import model_args
    from torchtitan.models.hf.converters import hf_converter
    from torchtitan.models.hf.weights import checkpointed_tensors
    from torchtitan.models.train_spec import get_train_spec
    from torchtitan.training.model_args import initial_rules

    assert dp_shard == ep, "the experts' FSDP mesh (dp_shard / ep) is 1 here"
    config = json.load(open(os.path.join(hf, "config.json")))
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[config["torch_dtype"]]
    args = model_args(DS, "tiny", config["vocab_size"], 64, rules=initial_rules(DS, hf))
    with torch.device("meta"):
        model = get_train_spec(DS).model_cls(args)
    experts = other = 0
    for fqn, t in checkpointed_tensors(model, hf_converter(DS)):
        if EXPERT_STACK.search(fqn):
            assert t.dim() == 3 and t.shape[0] % ep == 0, (fqn, t.shape)
            experts += t.numel() // ep * itemsize
        elif isinstance(t, torch.nn.Parameter):
            rows = [c.shape[0] for c in torch.empty(t.shape[0], device="meta").chunk(dp_shard)]
            rows += [0] * (dp_shard - len(rows))
            other += rows[rank] * (t.numel() // t.shape[0]) * itemsize
        else:  # expert_bias: a plain buffer, whole on every rank
            other += t.numel() * itemsize
    total = json.load(open(os.path.join(hf, "model.safetensors.index.json")))["metadata"][
        "total_size"
    ]
    return experts, other, total


def test_export_then_fsdp2_ep2_start_reads_half_per_rank(export, tmp_path):
    """(a) + (c): the exported folder starts FSDP2+EP2; each rank reads its 4 of 8 experts and its
    half of every other parameter (its FSDP chunk), i.e. about half of the folder."""
    run = _start(str(tmp_path / "fsdp2+ep2"), 2, export.hf, [EP])
    assert f"weights loaded from Hugging Face folder {export.hf}" in run.out, run.out[-3000:]
    reads = _rank_reads(run.dump, 2)
    mib = 2**20
    print(
        f"\nexport run (1 rank, 2 steps + DCP + HF): {export.secs:.1f}s; FSDP2+EP2 start: {run.secs:.1f}s"
    )
    print(
        f"{'rank':>4} {'MiB read':>9} {'expected':>9} {'experts':>8} {'other':>8} {'folder MiB':>10} {'share':>6}"
    )
    for rank, got in reads.items():
        experts, other, total = _expected_fsdp_ep_bytes(export.hf, rank)
        expected = experts + other
        print(
            f"{rank:>4} {got:>9.2f} {expected / mib:>9.4f} {experts / mib:>8.4f} {other / mib:>8.4f}"
            f" {total / mib:>10.4f} {expected / total:>6.1%}"
        )
        # The log prints 2 decimals: exact up to its rounding.
        assert abs(got - expected / mib) <= 0.005 + 1e-9, (rank, got, expected / mib)
        assert 0.45 < expected / total < 0.55, (rank, expected, total)


@pytest.fixture(scope="module")
def hf_1rank(export, tmp_path_factory) -> Start:
    """The 1-rank start from the folder, 3 steps."""
    return _start(str(tmp_path_factory.mktemp("deepseek_hf") / "hf_1rank"), 1, export.hf, steps=3)


@pytest.mark.slow
def test_layouts_start_with_the_1_rank_first_loss_and_hf_trains_as_dcp(export, hf_1rank, tmp_path):
    """(b) 1 rank, FSDP2+EP2, PP2+EP2 (dp_shard 2 holds EP), TP2+EP2 from the folder: one first
    loss; the 1-rank start trains bitwise as the start from the run's own DCP step-2."""
    dcp = _start(str(tmp_path / "dcp_1rank"), 1, export.dcp, steps=3)
    # Same weights (the export is float32), same data, same 1-rank math: bitwise.
    assert (hf_1rank.losses, hf_1rank.grad_norms) == (dcp.losses, dcp.grad_norms), (hf_1rank, dcp)
    layouts = {"1 rank": hf_1rank, "1 rank (DCP step-2)": dcp}
    for name, ngpu, overrides in (
        ("FSDP2+EP2", 2, [EP]),
        ("PP2+EP2", 4, [PP, EP]),
        ("TP2+EP2", 4, [TP, EP]),
    ):
        layouts[name] = _start(str(tmp_path / name), ngpu, export.hf, overrides)
        assert f"weights loaded from Hugging Face folder {export.hf}" in layouts[name].out
    ref = hf_1rank.losses[0]
    print(f"\n{'layout':22s} {'first loss':>20s} {'rel diff':>9s} {'wall s':>7s}")
    for name, run in layouts.items():
        print(
            f"{name:22s} {run.losses[0]!r:>20s} {abs(run.losses[0] - ref) / abs(ref):>9.1e} {run.secs:>7.1f}"
        )
    for name, run in layouts.items():
        assert abs(run.losses[0] - ref) <= FIRST_LOSS_RTOL * abs(ref), (name, run.losses[0], ref)


def _tensors(folder: str) -> dict:
    from safetensors.torch import load_file

    out = {}
    for file in glob.glob(os.path.join(folder, "*.safetensors")):
        out.update(load_file(file))
    return out


def _script(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(run_tests.ROOT, "scripts", "convert_hf.py"), *argv],
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_script_converts_both_ways_and_its_dcp_folder_starts_alike(export, hf_1rank, tmp_path):
    """scripts/convert_hf.py: folder -> model-only DCP step folder -> folder gives bitwise the
    original tensors (and config); a run from the DCP folder has the folder's first loss."""
    bad = str(tmp_path / "bad")
    wrong = _script(export.hf, bad, "--model", DS, "--flavor", "16B")
    assert wrong.returncode == 2 and not os.path.exists(bad) and not os.path.exists(bad + ".tmp"), (
        wrong
    )
    assert (
        wrong.stderr.count("\n") == 1 and "holds another model than deepseek_v3 16B" in wrong.stderr
    )
    no_flavor = _script(export.hf, bad)
    assert (
        no_flavor.returncode == 2
        and "needs --model and --flavor" in no_flavor.stderr
        and not os.path.exists(bad)
    )

    dcp, back = str(tmp_path / "imported" / "step-0"), str(tmp_path / "back")
    to_dcp = _script(export.hf, dcp, "--model", DS, "--flavor", "tiny")
    assert to_dcp.returncode == 0, to_dcp.stderr
    marker = json.load(open(os.path.join(dcp, ".complete")))
    assert (
        marker["model"] == "deepseek_v3/tiny"
        and marker["model_only"]
        and marker["dtype"] == "float32"
    ), marker
    assert marker["hf_args"]["yarn"] == "never", (
        marker
    )  # the folder's rule (exported at seq_len 64 <= 64)
    to_hf = _script(dcp, back)
    assert to_hf.returncode == 0, to_hf.stderr
    ours, theirs = _tensors(export.hf), _tensors(back)
    assert sorted(ours) == sorted(theirs)
    assert all(ours[k].dtype == theirs[k].dtype and ours[k].equal(theirs[k]) for k in ours)
    assert json.load(open(os.path.join(back, "config.json"))) == json.load(
        open(os.path.join(export.hf, "config.json"))
    )

    # The trainer's own model-only keys and shapes (the run's step-2 checkpoint's "model." entries).
    from torch.distributed.checkpoint import FileSystemReader

    def model_entries(path):
        meta = FileSystemReader(path).read_metadata().state_dict_metadata
        return {
            k: (tuple(v.size), v.properties.dtype)
            for k, v in meta.items()
            if k.startswith("model.")
        }

    assert model_entries(dcp) == model_entries(export.dcp)

    run = _start(str(tmp_path / "from_script_dcp"), 1, dcp)
    print(
        f"\nfirst loss from the folder {hf_1rank.losses[0]!r}, from the script's DCP folder {run.losses[0]!r}"
    )
    assert run.losses[0] == hf_1rank.losses[0], (run.losses, hf_1rank.losses)
