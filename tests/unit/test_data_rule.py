"""The slot rule (data/slots.py), the mixture pattern (data/mixture.py), stream sources read
shard by shard, and old checkpoint positions refused (data/dataloader.py)."""

import itertools
import json

import pytest

from torchtitan.config import build_config
from torchtitan.data.dataloader import (
    StateVersionError,
    build_dataloader,
    part_slots,
    worker_layout,
)
from torchtitan.data.kinds import open_documents
from torchtitan.data.mixture import MixError, parse_mix, pattern, quotas, windows_by_source
from torchtitan.data.slots import empty_slot, read_amplification, read_case, slot_plan
from torchtitan.data.tokenizer import Tokenizer


@pytest.mark.parametrize("shards, slots", list(itertools.product(range(1, 13), range(1, 13))))
def test_every_document_of_every_shard_goes_to_exactly_one_slot(shards, slots):
    size = 60  # documents per shard
    owner = {}
    for s in range(slots):
        plan = slot_plan(s, slots, shards)
        assert plan.shards and all(0 <= k < shards for k in plan.shards)
        for k in plan.shards:
            for i in range(plan.offset, size, plan.stride):
                assert (k, i) not in owner, (k, i, owner.get((k, i)), s)
                owner[(k, i)] = s
    assert len(owner) == shards * size
    if shards >= slots:  # whole shards, contiguous, in order
        assert [k for s in range(slots) for k in slot_plan(s, slots, shards).shards] == list(
            range(shards)
        )


def test_one_shard_reads_documents_i_i_plus_g():
    plan = slot_plan(3, 8, 1)
    assert (plan.shards, plan.stride, plan.offset) == ((0,), 8, 3)


def test_empty_slot_and_amplification():
    assert empty_slot([3], 4) == 3 and empty_slot([4], 4) is None
    assert empty_slot([5, 0, 5], 3) == 1  # slot 1 owns the empty shard alone
    assert empty_slot([2, 2], 4) is None and empty_slot([2, 1], 4) == 3
    assert read_amplification(rows_per_rank=2, num_slots=8, num_shards=8) == 1.0
    assert (
        read_amplification(rows_per_rank=2, num_slots=8, num_shards=2) == 2.0
    )  # 4 slots a shard: 2 ranks read each
    what, fix = read_case("stream", 2, 8, 2)
    assert fix.startswith("reads x2.00 of the source: 2 shard(s) for 8 rows of 2 per rank")
    assert read_case("tokenized", 1, 4096, 2) == (
        "pre-tokenized folder, random access: each document read once",
        None,
    )


def test_mixture_entries():
    sources = parse_mix(["data/web.jsonl:3", "hub/org:name:1"])
    assert [(s.dataset, s.weight, s.name) for s in sources] == [
        ("data/web.jsonl", 0.75, "web"),
        ("hub/org:name", 0.25, "org:name"),
    ]
    for entry, message in [
        ("a.jsonl", "entry 'a.jsonl' is not 'dataset:weight' (e.g. 'data/web.jsonl:0.7')"),
        ("a.jsonl:0", "entry 'a.jsonl:0': weight 0 must be a positive number"),
        ("a.jsonl:-1", "entry 'a.jsonl:-1': weight -1 must be a positive number"),
        ("a.jsonl:nan", "entry 'a.jsonl:nan': weight nan must be a positive number"),
        ("a.jsonl:x", "entry 'a.jsonl:x': weight 'x' is not a number"),
    ]:
        with pytest.raises(MixError) as info:
            parse_mix([entry])
        assert str(info.value) == message


def test_mixture_pattern_quotas_and_counts():
    weights = [0.7, 0.2, 0.1]
    pat = pattern(weights, num_slots=16)
    assert len(pat) == 1009 and [pat.count(k) for k in range(3)] == quotas(weights, 1009) == [
        706,
        202,
        101,
    ]
    assert len(pattern(weights, num_slots=1009)) == 1013  # the period never divides G
    for windows in (0, 5, 1009, 5000, 123457):
        brute = [0, 0, 0]
        for n in range(windows):
            brute[pat[n % len(pat)]] += 1
        assert windows_by_source(pat, windows) == brute
    # spread evenly: any 100 consecutive windows hold each source within 1 of its share
    for start in range(0, 1009, 37):
        window = [pat[(start + i) % 1009] for i in range(100)]
        assert abs(window.count(0) - 70) <= 1 and abs(window.count(2) - 10) <= 1


def test_worker_layout_and_parts():
    assert worker_layout(2, local_batch=2, accum_steps=1) == (2, 2)
    assert worker_layout(2, local_batch=1, accum_steps=4) == (2, 1)  # whole micro-steps
    assert worker_layout(3, local_batch=1, accum_steps=2) == (
        2,
        1,
    )  # 3 would need parts of a 1-row micro-step
    assert worker_layout(4, local_batch=2, accum_steps=2) == (4, 2)
    assert part_slots(first_slot=8, local_batch=4, accum_steps=2, p=2) == [
        [8, 9],
        [10, 11],
        [12, 13],
        [14, 15],
    ]


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def test_a_stream_of_three_files_is_read_by_the_rule(tmp_path):
    tok = Tokenizer()
    data = tmp_path / "data"
    data.mkdir()
    files = [[f"file {k} document {i} " * 3 for i in range(n)] for k, n in enumerate((4, 2, 3))]
    for k, texts in enumerate(files):
        _jsonl(data / f"train-{k}.jsonl", texts)
    src = open_documents(str(data), "train", "", "text", tok)
    assert (src.kind, src.num_shards) == ("stream", 3)
    seq, slots = 8, 6  # S < G: slots 0-1 share file 0, 2-3 file 1, 4-5 file 2
    cfg = build_config(
        [f"--training.dataset={data}", "--training.local_batch_size=2", f"--training.seq_len={seq}"]
    )[0].training
    for rank in range(3):
        it = iter(build_dataloader(cfg, tok, rank, 3, 1))
        got = [next(it)[0] for _ in range(4)]
        for row in range(2):
            s = 2 * rank + row
            plan = slot_plan(s, slots, 3)
            docs = files[plan.shards[0]][plan.offset :: plan.stride]
            stream = [t for _ in range(20) for d in docs for t in tok.encode(d)]
            for step in range(4):
                assert (
                    got[step][row].tolist() == stream[step * (seq + 1) : step * (seq + 1) + seq]
                ), (s, step)


def test_a_position_from_before_this_format_is_refused_in_one_line():
    cfg = build_config(["--training.local_batch_size=2", "--training.seq_len=8"])[0].training
    loader = build_dataloader(cfg, Tokenizer(), 0, 1, 1)
    with pytest.raises(StateVersionError) as info:
        loader.load_state_dict(
            {
                0: {"source": {}, "buffer": [1, 2], "epoch": 0},
                1: {"source": {}, "buffer": [], "epoch": 0},
            }
        )
    assert str(info.value).startswith(
        "the checkpoint's data position was written before documents were read once per job (format 1, this build"
        " reads 2); it cannot resume the data exactly: start a new run from its weights with"
        " --checkpoint.initial_load_path=<that step folder>"
    )


def test_observed_token_shares_over_a_million_tokens(tmp_path):
    """Sources of very different document lengths (10-40 vs 300-1,500 words); each window is
    attributed by its text (A holds only 'alpha', B only 'beta'), not by the formula."""
    import random

    rng = random.Random(0)
    for name, word, (lo, hi) in (("A", "alpha", (10, 40)), ("B", "beta", (300, 1500))):
        _jsonl(
            tmp_path / f"{name}.jsonl",
            [" ".join([word] * rng.randint(lo, hi)) for _ in range(3000)],
        )
    tok, seq, lbs, dp = Tokenizer(), 64, 4, 4
    cfg = build_config(
        [
            f"--training.dataset_mix={tmp_path}/A.jsonl:0.7,{tmp_path}/B.jsonl:0.3",
            f"--training.seq_len={seq}",
            f"--training.local_batch_size={lbs}",
        ]
    )[0].training
    tokens = {"A": 0, "B": 0}
    steps = 1_000_000 // (seq * lbs * dp) + 1
    for rank in range(dp):
        it = iter(build_dataloader(cfg, tok, rank, dp, 1))
        for _ in range(steps):
            for row in next(it)[0]:
                text = tok.decode(row.tolist())
                assert ("alpha" in text) != ("beta" in text)  # a window comes from one source
                tokens["A" if "alpha" in text else "B"] += seq
    total = sum(tokens.values())
    assert total >= 1_000_000
    assert abs(tokens["A"] / total - 0.7) < 0.01 and abs(tokens["B"] / total - 0.3) < 0.01, tokens
