"""Tokenizer, embedded corpus, packed slot datasets and the dataloader (sharding, resume, local files)."""

import json
import os

import pytest
import torch

from torchtitan.checks import load_config
from torchtitan.config import ConfigError, build_config
from torchtitan.data import corpus
from torchtitan.data.corpus import pydoc_documents
from torchtitan.data.dataloader import build_dataloader
from torchtitan.data.datasets import DataError
from torchtitan.data.tokenizer import BUNDLED_TOKENIZER, Tokenizer

LBS, SEQ = 2, 32

# torchdata calls a deprecated torch API on every loader; it says nothing about this package
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    return Tokenizer()


@pytest.fixture(scope="session")
def docs() -> list[str]:
    return pydoc_documents()


def training_cfg(*extra, lbs=LBS, seq=SEQ):
    cfg, _ = load_config(
        [f"--training.local_batch_size={lbs}", f"--training.seq_len={seq}", *extra], 1
    )
    return cfg.training


def take(loader_iter, n):
    return [next(loader_iter) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb)
        assert torch.equal(ya, yb)


# --------------------------------------------------------------------------- tokenizer


ROUND_TRIP = [
    "hello world",
    "naïve café — 東京",
    "  leading and trailing spaces  ",
    "def f(x):\n\treturn x ** 2\n",
    "emoji 🎉 and math ∑ᵢ xᵢ²",
    "a\r\nb\x00c",
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, bos=False, eos=False)) == text


def test_tokenizer_adds_bos_and_eos(tok):
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2048)
    body = tok.encode("naïve café — 東京", bos=False, eos=False)
    assert body and tok.bos_id not in body and tok.eos_id not in body
    assert tok.encode("naïve café — 東京") == [0, *body, 1]
    assert tok.encode("naïve café — 東京", eos=False) == [0, *body]
    assert tok.encode("naïve café — 東京", bos=False) == [*body, 1]
    assert tok.encode("") == [0, 1]
    assert all(0 <= i < tok.vocab_size for i in body)


def test_tokenizer_from_folder_and_path(tok):
    by_folder = Tokenizer(os.path.dirname(BUNDLED_TOKENIZER))
    assert by_folder.path == BUNDLED_TOKENIZER
    assert by_folder.encode("naïve café") == tok.encode("naïve café")


def _word_level_tokenizer(path, words):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    t = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[-1]))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(path))
    return str(path)


def test_tokenizer_finds_other_bos_eos_names(tmp_path):
    sp = Tokenizer(_word_level_tokenizer(tmp_path / "sp.json", ["hi", "<s>", "</s>", "<unk>"]))
    assert (sp.bos_id, sp.eos_id, sp.vocab_size) == (1, 2, 4)
    assert sp.encode("hi hi") == [1, 0, 0, 2]
    gpt = Tokenizer(_word_level_tokenizer(tmp_path / "gpt.json", ["<|endoftext|>", "hi", "<unk>"]))
    assert (gpt.bos_id, gpt.eos_id) == (0, 0)
    both = Tokenizer(
        _word_level_tokenizer(
            tmp_path / "both.json", ["<s>", "</s>", "<|end_of_text|>", "<|begin_of_text|>", "?"]
        )
    )
    assert (both.bos_id, both.eos_id) == (3, 2)  # Llama3 names win


def test_tokenizer_without_bos_eos(tmp_path):
    path = _word_level_tokenizer(tmp_path / "plain.json", ["a", "b", "<unk>"])
    with pytest.raises(ValueError) as info:
        Tokenizer(path)
    assert str(info.value) == (
        f"tokenizer '{path}' has none of the BOS/EOS token pairs [('<|begin_of_text|>', '<|end_of_text|>'),"
        " ('<s>', '</s>'), ('<|endoftext|>', '<|endoftext|>')]"
    )


# --------------------------------------------------------------------------- corpus


def test_pydoc_documents_nonempty_and_deterministic(docs):
    from pydoc_data.topics import topics

    assert len(docs) > 100
    assert pydoc_documents() == docs
    assert all(d.strip() for d in docs)
    assert sum(len(d) for d in docs) > 100_000
    short = [d for d in docs if len(d) < corpus.MIN_DOC_CHARS]
    assert len(short) <= len(topics)  # at most one short remainder per topic


def test_pydoc_documents_grouping(monkeypatch):
    import pydoc_data.topics

    monkeypatch.setattr(
        pydoc_data.topics,
        "topics",
        {
            "b": "p1\n\np2\n\np3",
            "a": "xxxxxxxxxxxx\n\ny",
            "c": "abcdefg\n\n  ",
            "d": "q\n\n\n\nrstuv",
        },
    )
    monkeypatch.setattr(corpus, "MIN_DOC_CHARS", 6)
    assert pydoc_documents() == ["xxxxxxxxxxxx", "y", "p1\n\np2", "p3", "abcdefg", "q\n\n\n\nrstuv"]


# --------------------------------------------------------------------------- dataloader on pydoc


@pytest.fixture(scope="module")
def one_rank_accum4(tok):
    """4 steps x 4 micro-steps of the 1-rank, 4-accumulation-step layout (8 slots)."""
    loader = build_dataloader(training_cfg(), tok, dp_rank=0, dp_degree=1, accum_steps=4)
    return take(iter(loader), 16)


def test_batches_have_shape_and_shifted_labels(one_rank_accum4, tok):
    for inputs, labels in one_rank_accum4:
        assert inputs.shape == labels.shape == (LBS, SEQ)
        assert inputs.dtype == labels.dtype == torch.long
        assert torch.equal(labels[:, :-1], inputs[:, 1:])
        assert int(inputs.min()) >= 0 and int(inputs.max()) < tok.vocab_size


def test_first_row_of_every_slot_is_the_start_of_its_document(one_rank_accum4, tok, docs):
    # slot s reads documents s, s + 8, s + 16, ...; its first window is BOS + the start of doc s
    for micro in range(4):
        inputs, labels = one_rank_accum4[micro]
        for row in range(LBS):
            slot = micro * LBS + row
            window = tok.encode(docs[slot])[: SEQ + 1]
            assert inputs[row].tolist() == window[:-1]
            assert labels[row].tolist() == window[1:]


def test_packing_is_contiguous_within_a_slot(one_rank_accum4, tok, docs):
    # consecutive windows of one slot tile its token stream: docs slot, slot + 8, ... with BOS/EOS
    slot = 3
    stream = [t for d in docs[slot::8][:3] for t in tok.encode(d)]
    rows = [one_rank_accum4[step * 4 + slot // LBS][0][slot % LBS] for step in range(4)]
    labels = [one_rank_accum4[step * 4 + slot // LBS][1][slot % LBS] for step in range(4)]
    for step in range(4):
        window = stream[step * (SEQ + 1) : (step + 1) * (SEQ + 1)]
        assert rows[step].tolist() == window[:-1]
        assert labels[step].tolist() == window[1:]


def test_dp_ranks_read_disjoint_rows_and_match_gradient_accumulation(one_rank_accum4, tok):
    cfg = training_cfg()
    per_rank = []
    for rank in range(4):
        loader = build_dataloader(cfg, tok, dp_rank=rank, dp_degree=4, accum_steps=1)
        per_rank.append(take(iter(loader), 4))
    for step in range(4):
        for rank in range(4):
            # rank r's batch at a step is micro-step r of the 1-rank layout at that step
            assert_same_batches([per_rank[rank][step]], [one_rank_accum4[step * 4 + rank]])
    # all windows of all ranks are different (each rank owns different documents)
    rows = [tuple(x[i].tolist()) for batches in per_rank for x, _ in batches for i in range(LBS)]
    assert len(rows) == 4 * 4 * LBS
    assert len(set(rows)) == len(rows)


def test_two_ranks_with_two_accumulation_steps_match_too(one_rank_accum4, tok):
    cfg = training_cfg()
    for rank in range(2):
        got = take(iter(build_dataloader(cfg, tok, dp_rank=rank, dp_degree=2, accum_steps=2)), 4)
        expected = [
            one_rank_accum4[step * 4 + rank * 2 + micro] for step in range(2) for micro in range(2)
        ]
        assert_same_batches(got, expected)


def test_resume_gives_the_same_next_batches(tok):
    cfg = training_cfg()
    loader = build_dataloader(cfg, tok, dp_rank=1, dp_degree=2, accum_steps=2)
    it = iter(loader)
    take(it, 4)  # two steps, with partly consumed documents in the streams
    state = loader.state_dict()
    expected = take(it, 5)

    resumed = build_dataloader(cfg, tok, dp_rank=1, dp_degree=2, accum_steps=2)
    resumed.load_state_dict(state)
    assert_same_batches(take(iter(resumed), 5), expected)


def test_resume_from_a_fresh_state_starts_at_the_beginning(tok):
    cfg = training_cfg()
    loader = build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)
    state = loader.state_dict()
    expected = take(iter(loader), 2)
    again = build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)
    again.load_state_dict(state)
    assert_same_batches(take(iter(again), 2), expected)


def test_slot_state_can_be_resplit_across_layouts(tok):
    cfg = training_cfg(lbs=1)
    single = build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=4)
    it = iter(single)
    take(it, 4 * 3)  # three steps of 4 micro-steps
    state = single.state_dict()
    expected = take(it, 8)
    assert set(state) == {0, 1, 2, 3}
    for rank in range(2):
        part = build_dataloader(cfg, tok, dp_rank=rank, dp_degree=2, accum_steps=2)
        part.load_state_dict(state)
        got = take(iter(part), 4)
        want = [expected[step * 4 + 2 * rank + i] for step in range(2) for i in range(2)]
        assert_same_batches(got, want)


# --------------------------------------------------------------------------- local files


def write_jsonl(path, texts, field="text"):
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({field: t, "id": len(t)}) + "\n")
    return str(path)


LOCAL_DOCS = [
    "First document: naïve café.",
    "Second document, a little longer than the first one.",
    "Third — 東京.",
    "Fourth document with def f(x): return x.",
    "Fifth.",
]


def test_local_jsonl_dataset(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", LOCAL_DOCS)
    cfg = training_cfg(f"--training.dataset={path}", lbs=2, seq=8)
    assert cfg.dataset == path
    got = take(iter(build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)), 6)
    # row 0 reads documents 0, 2, 4, 0, 2, ...; row 1 reads documents 1, 3, 1, 3, ...
    streams = [
        [t for _ in range(10) for d in LOCAL_DOCS[0::2] for t in tok.encode(d)],
        [t for _ in range(10) for d in LOCAL_DOCS[1::2] for t in tok.encode(d)],
    ]
    for step, (inputs, labels) in enumerate(got):
        assert inputs.shape == (2, 8)
        for row in range(2):
            window = streams[row][step * 9 : (step + 1) * 9]
            assert inputs[row].tolist() == window[:-1]
            assert labels[row].tolist() == window[1:]


def test_local_jsonl_with_another_text_field(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", LOCAL_DOCS, field="body")
    cfg = training_cfg(
        f"--training.dataset={path}", "--training.dataset_text_field=body", lbs=1, seq=8
    )
    inputs, labels = next(iter(build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)))
    window = tok.encode(LOCAL_DOCS[0])[:9]
    assert inputs[0].tolist() == window[:-1] and labels[0].tolist() == window[1:]


def test_local_txt_dataset_has_one_document_per_line(tmp_path, tok):
    path = tmp_path / "train.txt"
    path.write_text("alpha beta gamma\ndelta epsilon\n")
    cfg = training_cfg(f"--training.dataset={path}", lbs=1, seq=4)
    got = take(iter(build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)), 3)
    stream = tok.encode("alpha beta gamma") + tok.encode("delta epsilon")
    stream = stream * 3
    for step, (inputs, _) in enumerate(got):
        assert inputs[0].tolist() == stream[step * 5 : step * 5 + 4]


def test_dataset_with_fewer_documents_than_rows(tmp_path, tok):
    path = write_jsonl(tmp_path / "one.jsonl", ["only one document"])
    # the config check rejects this dataset (test_check_data.py); the loader's own error is the backstop
    cfg = build_config(
        [f"--training.dataset={path}", "--training.local_batch_size=2", "--training.seq_len=8"]
    )[0].training
    with pytest.raises(DataError) as info:
        next(iter(build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)))
    assert str(info.value) == (
        f"--training.dataset: dataset '{path}' (split 'train'): dataset slot 1 of 2 holds no documents: the dataset"
        " has fewer documents than the 2 rows of a global batch; add documents or lower the batch size"
    )


def test_config_check_rejects_a_local_file_type_the_loader_cannot_read(tmp_path):
    path = tmp_path / "train.xml"
    path.write_text("<doc/>")
    with pytest.raises(ConfigError) as info:
        load_config([f"--training.dataset={path}"], 1)
    assert str(info.value) == (
        f"--training.dataset: cannot read '{path}': use a .json/.jsonl/.parquet/.txt/.csv/.arrow file or a folder"
    )
