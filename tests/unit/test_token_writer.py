"""Pre-tokenized folders written in-process (one process; the multi-process path runs in
tests/integration/test_data_runs.py): the same tokens as the raw source, the source's shards
recorded, a killed run resumed without rewriting finished units, refusals before writing."""

import json
import os

import numpy as np
import pytest

import torchtitan.data.token_writer as tw
from torchtitan.checks import load_config
from torchtitan.data.dataloader import build_dataloader
from torchtitan.data.kinds import open_documents
from torchtitan.data.token_folder import TokenFolder, check_folder
from torchtitan.data.tokenizer import Tokenizer

quiet = dict(log=lambda line: None)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer()


def _jsonl(path, n, word="doc"):
    path.write_text(
        "".join(json.dumps({"text": f"{word} {i} " * (3 + i % 17)}) + "\n" for i in range(n))
    )
    return str(path)


def _batches(dataset, tok, dp_rank, dp, accum, n=6):
    cfg, _ = load_config(
        [f"--training.dataset={dataset}", "--training.local_batch_size=2", "--training.seq_len=16"],
        1,
    )
    it = iter(build_dataloader(cfg.training, tok, dp_rank, dp, accum))
    return [next(it) for _ in range(n)]


def test_a_jsonl_folder_holds_the_raw_tokens_and_trains_alike(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(tw, "DOCS_PER_UNIT", 7)  # several units
    raw = _jsonl(tmp_path / "d.jsonl", 40)
    manifest = tw.tokenize_dataset(raw, str(tmp_path / "out"), tok, **quiet)
    assert manifest == check_folder(str(tmp_path / "out"), tok.fingerprint)
    assert (
        manifest["docs"] == 40 and manifest["source_shards"] == [40] and len(manifest["files"]) == 6
    )
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["has_bos"] is True
    folder, source = (
        TokenFolder(str(tmp_path / "out")),
        open_documents(raw, "train", "", "text", tok),
    )
    for i in range(40):
        assert np.array_equal(folder.tokens(0, i), source.tokens(0, i))
    assert folder.tokens(0, 40) is None
    for dp_rank, dp, accum in ((0, 1, 2), (1, 2, 1)):
        for (a, la), (b, lb) in zip(
            _batches(raw, tok, dp_rank, dp, accum),
            _batches(str(tmp_path / "out"), tok, dp_rank, dp, accum),
        ):
            assert a.equal(b) and la.equal(lb)
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "out"]  # no .partial left


def test_a_stream_records_its_shards(tmp_path, tok):
    data = tmp_path / "data"
    data.mkdir()
    for k, n in enumerate((5, 3, 4)):
        _jsonl(data / f"train-{k}.jsonl", n, word=f"s{k}")
    manifest = tw.tokenize_dataset(str(data), str(tmp_path / "out"), tok, **quiet)
    assert manifest["source_shards"] == [5, 3, 4]
    for dp_rank, dp, accum in ((0, 1, 4), (1, 2, 2)):  # G = 8 rows over 3 shards
        for (a, _), (b, _) in zip(
            _batches(str(data), tok, dp_rank, dp, accum),
            _batches(str(tmp_path / "out"), tok, dp_rank, dp, accum),
        ):
            assert a.equal(b)


def test_a_killed_run_resumes_after_its_finished_units(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(tw, "DOCS_PER_UNIT", 10)
    raw = _jsonl(tmp_path / "d.jsonl", 30)
    calls = []
    real = tw._write_unit

    def dies_after_one(job):
        if calls:
            raise KeyboardInterrupt  # the kill
        calls.append(job[0])
        return real(job)

    monkeypatch.setattr(tw, "_write_unit", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        tw.tokenize_dataset(raw, str(tmp_path / "out"), tok, **quiet)
    partial = tmp_path / "out.partial"
    assert not (tmp_path / "out").exists() and (partial / "part-00000.json").exists()
    assert not (partial / "part-00001.bin").exists() and not (partial / "manifest.json").exists()
    first = os.stat(partial / "part-00000.bin").st_mtime_ns
    monkeypatch.setattr(tw, "_write_unit", real)
    lines = []
    tw.tokenize_dataset(raw, str(tmp_path / "out"), tok, log=lines.append)
    assert "1 already done (resumed)" in lines[0]
    assert os.stat(tmp_path / "out" / "part-00000.bin").st_mtime_ns == first
    tw.tokenize_dataset(raw, str(tmp_path / "again"), tok, **quiet)
    for name in sorted(os.listdir(tmp_path / "again")):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), (
            name
        )


def test_refusals_write_nothing(tmp_path, tok):
    raw = _jsonl(tmp_path / "d.jsonl", 5)
    tw.tokenize_dataset(raw, str(tmp_path / "out"), tok, **quiet)
    before = sorted(os.listdir(tmp_path))
    cases = [
        (
            dict(dataset=raw, out=str(tmp_path / "out")),
            f"--out: '{tmp_path / 'out'}' exists; give a new folder",
        ),
        (
            dict(dataset=str(tmp_path / "out"), out=str(tmp_path / "x")),
            "--dataset: '"
            + str(tmp_path / "out")
            + "' is already a pre-tokenized folder; train on it directly",
        ),
        (dict(dataset=raw, out=str(tmp_path / "y"), num_proc=0), "--num-proc=0: must be >= 1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(tw.WriteError) as info:
            tw.tokenize_dataset(tokenizer=tok, **kwargs, **quiet)
        assert str(info.value).startswith(message)
    (tmp_path / "z.partial").mkdir()
    (tmp_path / "z.partial" / "plan.json").write_text("{}")
    with pytest.raises(tw.WriteError) as info:
        tw.tokenize_dataset(raw, str(tmp_path / "z"), tok, **quiet)
    assert "holds an unfinished run of another source, tokenizer or split" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == sorted(before + ["z.partial"])


def test_a_shard_truncated_while_training_is_one_line_naming_file_and_document(tmp_path, tok):
    from torchtitan.data.datasets import DataError

    raw = _jsonl(tmp_path / "d.jsonl", 40)
    tw.tokenize_dataset(raw, str(tmp_path / "out"), tok, **quiet)
    cfg, _ = load_config(
        [
            f"--training.dataset={tmp_path / 'out'}",
            "--training.local_batch_size=2",
            "--training.seq_len=16",
        ],
        1,
    )
    it = iter(build_dataloader(cfg.training, tok, 0, 1, 1))
    next(it)  # the check passed and the run reads
    part = tmp_path / "out" / "part-00000.bin"
    with open(part, "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError) as info:
        for _ in range(40):
            next(it)
    message = str(info.value)
    assert (
        message.startswith(f"--training.dataset: {part} is truncated (document ")
        and "\n" not in message
    )
    assert message.endswith(
        "re-create the folder with scripts/tokenize_dataset.py, then resume from the last"
        " checkpoint (it is intact)"
    )


def test_a_source_that_runs_dry_starts_its_next_epoch_and_says_so(tmp_path, tok):
    raw = _jsonl(tmp_path / "d.jsonl", 4)
    cfg, _ = load_config(
        [f"--training.dataset={raw}", "--training.local_batch_size=2", "--training.seq_len=16"], 1
    )
    lines = []
    it = iter(build_dataloader(cfg.training, tok, 0, 1, 1, log=lines.append))
    first = [next(it)[0] for _ in range(12)]
    # two slots reach each epoch at their own pace: one line per epoch, in order
    epochs = len(lines) + 1
    assert epochs > 2 and lines == [
        f"[torchtitan] data: dataset '{raw}' (split 'train'): epoch {e} begins (its"
        " documents are read again)"
        for e in range(2, epochs + 1)
    ]
    slot0 = [t for _ in range(4) for d in (0, 2) for t in tok.encode(f"doc {d} " * (3 + d % 17))]
    assert first[0][0].tolist() == slot0[:16]
