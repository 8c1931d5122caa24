"""Training from pre-tokenized folders and mixtures, through the trainer: the same job from raw
text and from its tokenized folder gives bitwise the same losses; a mixture resumed mid-run
(with another count of loader workers) is bitwise the uninterrupted run; the same mixture on
one rank with accumulation and on four ranks agree; a folder truncated after a run
is refused in one line naming the file, and the last checkpoint stays. (A shard truncated
while the run reads it: tests/unit/test_data_layout.py.)"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import run_tests

SHORT = ["--training.steps=4", "--training.global_batch_size=4"]
CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=3"]


def _losses(dump):
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f)) if "loss" in r}


def _train(tmp_path, name, ngpu, overrides, dump=None):
    dump = dump or str(tmp_path / name)
    rc, _, out = run_tests.run(ngpu, overrides, dump)
    assert rc == 0, out[-3000:]
    return _losses(dump), out


def _jsonl(path, docs):
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, repo_root, subprocess_env):
    """Two raw sources of very different document lengths and the tokenized folder of the first."""
    from torchtitan.data.corpus import pydoc_documents

    root = tmp_path_factory.mktemp("corpora")
    docs = pydoc_documents()
    long_docs = _jsonl(root / "long.jsonl", docs[:120])
    short_docs = _jsonl(
        root / "short.jsonl", [p for d in docs[120:200] for p in d.split("\n\n") if p.strip()][:400]
    )
    folder = str(root / "long_tokens")
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(repo_root, "scripts", "tokenize_dataset.py"),
            "--dataset",
            long_docs,
            "--out",
            folder,
            "--num-proc",
            "2",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {"long": long_docs, "short": short_docs, "long_tokens": folder}


def test_raw_text_and_its_tokenized_folder_train_bitwise_alike(tmp_path, corpora):
    # block_causal: the documents told apart in the packed windows are the same too
    args = [*SHORT, "--model.attn_mask=block_causal"]
    raw, out = _train(tmp_path, "raw", 1, [*args, f"--training.dataset={corpora['long']}"])
    tokens, out_t = _train(
        tmp_path, "tokens", 1, [*args, f"--training.dataset={corpora['long_tokens']}"]
    )
    assert sorted(raw) == [1, 2, 3, 4]
    assert raw == tokens
    assert "raw text, random access: each document read once" in out
    assert "pre-tokenized folder, random access: each document read once" in out_t


def test_mixture_resumes_bitwise_with_other_worker_counts(tmp_path, corpora):
    mix = f"--training.dataset_mix={corpora['long_tokens']}:0.7,{corpora['short']}:0.3"
    args = [
        "--training.steps=6",
        "--training.global_batch_size=4",
        mix,
        *CKPT,
        "--metrics.log_freq=1",
    ]
    dump = str(tmp_path / "mix")
    straight, out = _train(tmp_path, "mix", 2, [*args, "--training.dataloader.num_workers=2"], dump)
    assert "2 loader worker(s)" in out and "mix long_tokens 7" in out
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    windows = 6 * 4
    assert last["tokens_seen/long_tokens"] + last["tokens_seen/short"] == windows * 64
    shutil.rmtree(os.path.join(dump, "checkpoint", "step-6"))
    resumed, out = _train(tmp_path, "mix", 2, [*args, "--training.dataloader.num_workers=0"], dump)
    assert "resumed from step 3" in out
    assert [resumed[s] for s in (4, 5, 6)] == [straight[s] for s in (4, 5, 6)]


def test_mixture_on_one_rank_with_accumulation_matches_four_ranks(tmp_path, corpora):
    mix = f"--training.dataset_mix={corpora['long']}:0.6,{corpora['short']}:0.4"
    one, _ = _train(tmp_path, "one", 1, [*SHORT, mix, "--training.local_batch_size=1"])
    four, _ = _train(tmp_path, "four", 4, [*SHORT, mix, "--training.local_batch_size=1"])
    assert (
        run_tests.max_rel_diff([one[s] for s in range(1, 5)], [four[s] for s in range(1, 5)])
        <= 1e-5
    )


def test_a_truncated_folder_is_refused_in_one_line_and_the_checkpoint_stays(tmp_path, corpora):
    folder = str(tmp_path / "tokens")
    shutil.copytree(corpora["long_tokens"], folder)
    part = os.path.join(folder, "part-00000.bin")
    args = [*SHORT, f"--training.dataset={folder}", *CKPT]
    dump = str(tmp_path / "trunc")
    rc, _, out = run_tests.run(1, [*args, "--training.steps=3"], dump)
    assert rc == 0, out[-3000:]
    size = os.path.getsize(part)
    with open(part, "r+b") as f:
        f.truncate(64)
    rc, _, out = run_tests.run(1, [*args, "--training.steps=6"], dump)
    assert rc == 2, out[-3000:]
    assert (
        f"--training.dataset: '{part}' is truncated: 64 bytes, expected {size}; re-run"
        " scripts/tokenize_dataset.py"
    ) in out
    assert sorted(os.listdir(os.path.join(dump, "checkpoint"))) == ["step-3"]


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--dataset", "./no/such.jsonl", "--out", "{tmp}/out"],
            "error: --dataset: local dataset path './no/such.jsonl' does not exist",
        ),
        (
            ["--dataset", "pydoc", "--out", "{tmp}/out", "--tokenizer", "{tmp}/bad.json"],
            "error: --tokenizer: tokenizer '{tmp}/bad.json' is not an HF tokenizer.json: not JSON",
        ),
    ],
)
def test_tokenize_script_refuses_bad_input_in_one_line(
    args, line, tmp_path, repo_root, subprocess_env
):
    (tmp_path / "bad.json").write_text("not json")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run(
        [sys.executable, os.path.join(repo_root, "scripts", "tokenize_dataset.py"), *args],
        capture_output=True,
        text=True,
        env=subprocess_env,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line.replace("{tmp}", str(tmp_path))), (
        done.stderr
    )
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]
