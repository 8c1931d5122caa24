"""Qwen3 Hugging Face folders written by transformers through real runs: the dense tiny (tied
embeddings) into FSDP2 x TP2 on 4 ranks, the MoE tiny_moe into EP2 on 2 ranks (each rank reads
only its experts), both exported back (--checkpoint.last_save_in_hf) bitwise: the one step runs
at lr 1e-30, which changes no float32 weight (far below half an ulp of every value)."""

import glob
import json
import os
import re

import parity_cases
import pytest
import run_tests
import torch

LOADED = re.compile(
    r"weights loaded from Hugging Face folder (\S+) \((\d+) tensors, ([0-9.]+) MiB read on this rank\)"
)


def _hf_folder(folder: str, flavor: str) -> str:
    """A random transformers Qwen3 of the flavor (bundled tokenizer's 2,048 rows), saved."""
    import dataclasses

    import transformers

    from torchtitan.data.tokenizer import Tokenizer
    from torchtitan.models.flavors import model_args
    from torchtitan.models.qwen3 import hf_convert

    tok = Tokenizer("")
    args = model_args("qwen3", flavor, tok.vocab_size, 64)
    args = dataclasses.replace(args, max_seq_len=64)
    config = {
        k: v
        for k, v in hf_convert.hf_config(args, "float32", tok.bos_id, tok.eos_id).items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    torch.manual_seed(0)
    if args.moe:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**config))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))
    model.save_pretrained(folder)
    return folder


def _tensors(folder: str) -> dict:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def _reads(dump: str, ngpu: int) -> list[float]:
    reads = []
    for rank in range(ngpu):
        # (fast launcher: ranks/<r>/; torchrun: ranks/<run id>/attempt_0/<r>/)
        path = sorted(
            glob.glob(os.path.join(dump, "ranks", "**", str(rank), "stdout.log"), recursive=True)
        )[0]
        with open(path) as f:
            found = LOADED.findall(f.read())
        assert len(found) == 1, (rank, found)
        reads.append(float(found[0][2]))
    return reads


@pytest.mark.parametrize(
    "flavor,ngpu,layout",
    [
        ("tiny", 4, [parity_cases.TP, "--training.local_batch_size=4"]),
        ("tiny_moe", 2, [parity_cases.EP]),
    ],
    ids=["dense_fsdp2_tp2", "moe_ep2"],
)
def test_transformers_folder_in_and_out_bitwise(tmp_path, flavor, ngpu, layout):
    hf = _hf_folder(str(tmp_path / "hf"), flavor)
    dump = str(tmp_path / "run")
    rc, _, out = run_tests.run(
        ngpu,
        [
            f"--model.flavor={flavor}",
            "--training.steps=1",
            "--optimizer.lr=1e-30",
            f"--checkpoint.initial_load_path={hf}",
            "--checkpoint.enable=true",
            "--checkpoint.last_save_in_hf=true",
            *layout,
        ],
        dump,
        model=parity_cases.QWEN,
        extra_env={"LOG_RANK": ",".join(map(str, range(ngpu)))},
    )
    assert rc == 0, out[-3000:]
    reads = _reads(dump, ngpu)
    stored, written = _tensors(hf), _tensors(os.path.join(dump, "hf", "step-1"))
    assert set(written) == set(stored), set(written) ^ set(stored)
    changed = [n for n in stored if not torch.equal(written[n], stored[n])]
    assert not changed, changed
    config = json.load(open(os.path.join(dump, "hf", "step-1", "config.json")))
    assert config["model_type"] == ("qwen3_moe" if flavor == "tiny_moe" else "qwen3")
    folder_mib = sum(t.numel() * t.element_size() for t in stored.values()) / 2**20
    if flavor == "tiny_moe":
        # EP takes all of dp_shard (2): a rank reads its 4 of 8 experts and its FSDP half of
        # every other tensor, except q/k, whose rows RoPE's reordering mixes: read whole
        def mib(pred):
            return sum(t.numel() * t.element_size() for n, t in stored.items() if pred(n)) / 2**20

        experts = mib(lambda n: ".mlp.experts." in n)
        qk = mib(lambda n: n.endswith(("q_proj.weight", "k_proj.weight")))
        expected = experts / 2 + qk + (folder_mib - experts - qk) / 2
        assert all(abs(m - expected) < 0.01 for m in reads), (reads, expected)
    print(f"{flavor}: {folder_mib:.2f} MiB folder; read per rank {reads}")
