"""scripts/run_generate.sh on a real checkpoint: the tiny Llama3 trained a few steps on one
rank (DCP checkpoint + Hugging Face export of its last step), then greedy generation on one
rank and with TP 2 (torchrun, gloo) gives the same tokens, from the DCP folder and from the
Hugging Face folder alike; bad input is one line on stderr, exit 2, before any rank starts."""

import json
import os
import shutil
import subprocess

import pytest
import run_tests
import torch

from torchtitan.generate import Options, pick_token

MODEL = ["--model.flavor=tiny", "--training.seq_len=64", "--training.device=cpu"]
PROMPT = "def main():"
NEW = 8
STEPS = 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("gen") / "run")
    rc, _, out = run_tests.run(
        1,
        [
            f"--training.steps={STEPS}",
            "--checkpoint.enable=true",
            "--checkpoint.last_save_in_hf=true",
        ],
        dump,
    )
    assert rc == 0, out[-3000:]
    return dump


def generate(repo_root, env, ngpu, checkpoint, *extra, out=None):
    """run_generate.sh -> (exit code, stdout, stderr, the JSON report or None)."""
    cmd = [os.path.join(repo_root, "scripts", "run_generate.sh"), *MODEL, f"--max_new_tokens={NEW}"]
    if out is not None:
        cmd.append(f"--out={out}")
    env = {**env, "NGPU": str(ngpu), "CHECKPOINT_DIR": checkpoint, "PROMPT": PROMPT}
    p = subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, timeout=300)
    report = json.load(open(out)) if out is not None and os.path.exists(out) else None
    return p.returncode, p.stdout, p.stderr, report


def test_tp2_and_hf_give_the_one_rank_tokens(trained, repo_root, subprocess_env, tmp_path):
    ckpt = os.path.join(trained, "checkpoint")  # its newest complete step: step-6
    runs = {
        "dcp": (1, ckpt, []),
        "dcp_tp2": (2, ckpt, ["--parallelism.tensor_parallel_degree=2"]),
        "hf": (1, os.path.join(trained, "hf", f"step-{STEPS}"), []),
    }
    reports = {}
    for name, (ngpu, path, extra) in runs.items():
        rc, out, err, report = generate(
            repo_root, subprocess_env, ngpu, path, *extra, out=str(tmp_path / f"{name}.json")
        )
        assert rc == 0, f"{name}: {out[-2000:]}{err[-3000:]}"
        assert f"prompt: {PROMPT!r}" in out and f"{NEW} new tokens in" in out, out
        assert f"tokens/s on {ngpu} rank(s)" in out, out
        reports[name] = report
    one = reports["dcp"]
    assert one["checkpoint"] == os.path.join(ckpt, f"step-{STEPS}")
    assert len(one["new_ids"]) == NEW
    # no choice was near a tie that TP's other summation order could flip: equality means something
    assert one["min_margin"] > 1e-4, one
    for name in ("dcp_tp2", "hf"):
        assert reports[name]["new_ids"] == one["new_ids"], (name, reports[name], one)
        assert reports[name]["completion"] == one["completion"]
    assert reports["dcp_tp2"]["world_size"] == 2 and reports["hf"]["checkpoint_kind"] == "hf"


def test_wrong_path_is_one_line_before_any_rank(repo_root, subprocess_env, tmp_path):
    bad = str(tmp_path / "nope")
    out = str(tmp_path / "r.json")
    rc, stdout, stderr, report = generate(
        repo_root, subprocess_env, 2, bad, "--parallelism.tensor_parallel_degree=2", out=out
    )
    assert rc == 2 and stdout == "" and report is None
    assert stderr.splitlines() == [
        f"error: --checkpoint: '{bad}' does not exist; give a step folder"
        " (<dump_folder>/checkpoint/step-N), the checkpoint folder holding step-N folders, or a"
        " Hugging Face folder (config.json + *.safetensors)"
    ]


def test_checkpoint_of_another_shape_is_one_line(trained, repo_root, subprocess_env, tmp_path):
    # a step folder whose marker names the config's model, but whose tensors are the tiny flavor's
    step = str(tmp_path / f"step-{STEPS}")
    shutil.copytree(os.path.join(trained, "checkpoint", f"step-{STEPS}"), step)
    marker = json.load(open(os.path.join(step, ".complete")))
    json.dump({**marker, "model": "llama3/debugmodel"}, open(os.path.join(step, ".complete"), "w"))
    rc, stdout, stderr, _ = generate(
        repo_root, subprocess_env, 1, step, "--model.flavor=debugmodel"
    )
    assert rc == 2 and stdout == ""
    assert stderr.splitlines() == [
        f"error: --checkpoint: tensor 'model.tok_embeddings.weight' in '{step}' has shape"
        " [2048, 64], llama3 debugmodel needs [2048, 256]; pick the --model.flavor,"
        " --model.tokenizer_path and [moe] keys it was trained with"
    ]


def test_pick_token_greedy_top_k_and_seed():
    logits = torch.tensor([0.1, 2.0, 1.9, -3.0, 0.5])
    assert pick_token(logits, Options("", "", temperature=0.0)) == 1
    # top_k=1 leaves only the argmax, whatever is drawn
    g = torch.Generator().manual_seed(0)
    assert {
        pick_token(logits, Options("", "", temperature=5.0, top_k=1), g) for _ in range(50)
    } == {1}
    # top_k=2: only the two likeliest are ever drawn, both of them at a high temperature
    hot = Options("", "", temperature=100.0, top_k=2)
    g = torch.Generator().manual_seed(0)
    assert {pick_token(logits, hot, g) for _ in range(200)} == {1, 2}

    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return [pick_token(logits, Options("", "", temperature=1.0), g) for _ in range(40)]

    assert draws(3) == draws(3) and draws(3) != draws(4)
