#!/usr/bin/env python3
"""The bad-input catalogue: each case is a run_train.sh command that must fail with one line
naming the key or path and the fix, exit non-zero, start no process group and leave the
dump folder exactly as it was.

    python tests/integration/bad_inputs.py      # prints every case and its error line

test_bad_inputs.py runs the same cases under pytest.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_tests  # noqa: E402


def _ckpt_file(dump):  # the checkpoint folder path is taken by a file
    with open(os.path.join(dump, "checkpoint"), "w") as f:
        f.write("not a folder")


def _step(dump, step, marker=None, metadata=True):
    path = os.path.join(dump, "checkpoint", f"step-{step}")
    os.makedirs(path)
    if metadata:
        open(os.path.join(path, ".metadata"), "wb").close()
    if marker is not None:
        with open(os.path.join(path, ".complete"), "w") as f:
            json.dump(marker, f)


def _write(dump, name, text):
    path = os.path.join(dump, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _jsonl(dump, name, records):
    _write(dump, name, "".join(json.dumps(r) + "\n" for r in records))


def _docs(n, field="text"):
    return [{field: f"document {i} " * 20, "id": i} for i in range(n)]


def _word_tokenizer(dump, name, words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[-1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(dump, name))


# The hub cases must fail at once, without the network.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _hf_folder(dump, hidden_size=256, missing_file=False):
    """A Hugging Face folder at <dump>/hf: config.json and one safetensors file (or an index
    naming a file the download lacks)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = os.path.join(dump, "hf")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(
            {
                "model_type": "llama",
                "hidden_size": hidden_size,
                "num_hidden_layers": 6,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            f,
        )
    save_file(
        {"model.norm.weight": np.ones(hidden_size, dtype=np.float32)},
        os.path.join(folder, "model-1.safetensors"),
    )
    if missing_file:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump(
                {
                    "weight_map": {
                        "model.norm.weight": "model-1.safetensors",
                        "lm_head.weight": "model-2.safetensors",
                    }
                },
                f,
            )


def _token_folder(dump, name, docs=8, fingerprint="", bos_id=None, damage=""):
    """A pre-tokenized folder of `docs` short documents in data/token_folder's format, with the
    bundled tokenizer's fingerprint unless given; damage: "missing" (no .bin) or "truncated"."""
    import numpy as np

    from torchtitan.data import token_folder as tf
    from torchtitan.data.tokenizer import Tokenizer

    tok = Tokenizer()
    folder = os.path.join(dump, name)
    os.makedirs(folder)
    encoded = [tok.encode(f"document {i} " * 10) for i in range(docs)]
    offsets = np.cumsum([0] + [len(e) for e in encoded]).astype("<i8")
    np.concatenate(encoded).astype("<u2").tofile(os.path.join(folder, "part-00000.bin"))
    offsets.tofile(os.path.join(folder, "part-00000.idx"))
    manifest = {
        "format": tf.FORMAT,
        "version": tf.VERSION,
        "dtype": "uint16",
        "tokenizer": {
            "fingerprint": fingerprint or tok.fingerprint,
            "path": "tokenizer.json",
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id if bos_id is None else bos_id,
            "eos_id": tok.eos_id,
            "has_bos": True,
            "delimiting": tok.delimiting,
        },
        "source": {"dataset": "made by hand"},
        "source_shards": [docs],
        "files": [{"name": "part-00000", "docs": docs, "tokens": int(offsets[-1])}],
        "docs": docs,
        "tokens": int(offsets[-1]),
    }
    with open(os.path.join(folder, tf.MANIFEST), "w") as f:
        json.dump(manifest, f)
    if damage == "missing":
        os.remove(os.path.join(folder, "part-00000.bin"))
    elif damage == "truncated":
        with open(os.path.join(folder, "part-00000.bin"), "r+b") as f:
            f.truncate(10)


@dataclass
class BadInput:
    name: str
    args: list[str]  # "{dump}" stands for the case's dump folder
    expect: str  # a substring of the error line ("{dump}" too)
    ngpu: int = 2
    setup: Callable[[str], None] | None = None
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def _deepseek_folder(path: str, mscale: float) -> None:
    """A DeepSeek-V3 debugmodel folder whose YaRN mscale differs from mscale_all_dim (the
    config is checked before any tensor is read: one placeholder tensor is enough)."""
    import dataclasses

    import torch
    from safetensors.torch import save_file

    from torchtitan.models.deepseek_v3 import hf_convert
    from torchtitan.models.flavors import flavors_of

    args = dataclasses.replace(
        flavors_of("deepseek_v3")["debugmodel"], vocab_size=2048, yarn="always"
    )
    config = hf_convert.hf_config(args, "float32", 0, 1)
    config["rope_scaling"].update(mscale=mscale, mscale_all_dim=1.0)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({"model.norm.weight": torch.ones(args.dim)}, os.path.join(path, "model.safetensors"))


CASES = [
    BadInput(
        "unknown key",
        ["--parallelism.tensor_parallel_degre=2"],
        "unknown config key 'parallelism.tensor_parallel_degre' (did you mean 'parallelism.tensor_parallel_degree'?)",
    ),
    BadInput(
        "bad enum",
        ["--parallelism.fsdp_implementation=fsdp3"],
        "--parallelism.fsdp_implementation: invalid value 'fsdp3'; choose one of 'fsdp2', 'simple_fsdp'",
    ),
    BadInput("wrong type", ["--training.steps=ten"], "--training.steps"),
    BadInput(
        "degrees vs world size",
        ["--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=4"],
        "but the world size is 4",
        ngpu=4,
    ),
    BadInput(
        "TP degree vs heads",
        ["--parallelism.tensor_parallel_degree=3"],
        "--parallelism.tensor_parallel_degree=3 does not divide llama3 debugmodel n_heads=16",
        ngpu=3,
    ),
    BadInput(
        "layers vs stages",
        [
            "--parallelism.pipeline_parallel_degree=4",
            "--parallelism.pipeline_parallel_layers_per_stage=3",
        ],
        "= 3 stages, not a multiple of --parallelism.pipeline_parallel_degree=4",
        ngpu=4,
    ),
    BadInput(
        "batch vs microbatches",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--training.local_batch_size=3",
            "--parallelism.pipeline_parallel_microbatch_size=2",
        ],
        "--training.local_batch_size=3 does not split into microbatches of --parallelism.pipeline_parallel_microbatch_size=2",
    ),
    BadInput(
        "missing dataset path",
        ["--training.dataset=./no/such/data.jsonl"],
        "--training.dataset: local dataset path './no/such/data.jsonl' does not exist",
    ),
    BadInput(
        "missing tokenizer",
        ["--model.tokenizer_path=/no/such/tokenizer.json"],
        "--model.tokenizer_path: '/no/such/tokenizer.json' not found",
    ),
    BadInput(
        "checkpoint folder is a file",
        ["--checkpoint.enable=true"],
        "--checkpoint.folder: '",
        setup=_ckpt_file,
    ),
    BadInput(
        "load_step not there",
        ["--checkpoint.enable=true", "--checkpoint.load_step=5"],
        "--checkpoint.load_step=5: checkpoint '",
        setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 16}),
    ),
    BadInput(
        "corrupt checkpoint",
        ["--checkpoint.enable=true"],
        "is corrupt: its DCP .metadata file is missing",
        setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 16}, metadata=False),
    ),
    BadInput(
        "checkpoint of another batch",
        ["--checkpoint.enable=true"],
        "was saved with global batch 64 rows, this run has 8",
        setup=lambda d: _step(d, 3, {"step": 3, "global_batch": 64}),
    ),
    BadInput(
        "seed checkpoint on 2 ranks",
        ["--checkpoint.create_seed_checkpoint=true"],
        "--checkpoint.create_seed_checkpoint runs on one rank, not 2: use NGPU=1",
    ),
    # ---- tokenizer
    BadInput(
        "tokenizer is JSON but not a tokenizer",
        ["--model.tokenizer_path={dump}/tok.json"],
        "--model.tokenizer_path='{dump}/tok.json': not an HF tokenizer.json: JSON, but no tokenizer 'model' in it"
        " (its keys: a); give the tokenizer.json of a Hugging Face tokenizer",
        setup=lambda d: _write(d, "tok.json", '{"a": 1}'),
    ),
    BadInput(
        "tokenizer is not JSON",
        ["--model.tokenizer_path={dump}/tok.json"],
        "--model.tokenizer_path='{dump}/tok.json': not an HF tokenizer.json: not JSON (Expecting value: line 1 column 1",
        setup=lambda d: _write(d, "tok.json", "vocab: 32000\n"),
    ),
    BadInput(
        "tokenizer file is empty",
        ["--model.tokenizer_path={dump}/tok.json"],
        "--model.tokenizer_path='{dump}/tok.json': not an HF tokenizer.json: the file is empty",
        setup=lambda d: _write(d, "tok.json", ""),
    ),
    BadInput(
        "tokenizer folder without tokenizer.json",
        ["--model.tokenizer_path={dump}/tokdir"],
        "--model.tokenizer_path: '{dump}/tokdir/tokenizer.json' not found",
        setup=lambda d: _write(d, "tokdir/tokenizer_config.json", "{}"),
    ),
    BadInput(
        "tokenizer without BOS/EOS",
        ["--model.tokenizer_path={dump}/tok.json"],
        "--model.tokenizer_path='{dump}/tok.json': the tokenizer has none of the BOS/EOS token pairs"
        " <|begin_of_text|> <|end_of_text|>, <s> </s>, <|endoftext|>",
        setup=lambda d: _word_tokenizer(d, "tok.json", ["a", "b", "<unk>"]),
    ),
    BadInput(
        "tokenizer larger than the flavor's vocabulary",
        ["--model.flavor=8B", "--model.tokenizer_path={dump}/tok.json"],
        "--model.tokenizer_path='{dump}/tok.json': the tokenizer has 128259 tokens but llama3 8B has only 128256"
        " embeddings (its fixed vocab_size)",
        setup=lambda d: _word_tokenizer(
            d, "tok.json", ["<s>", "</s>", *(f"w{i}" for i in range(128256)), "<unk>"]
        ),
    ),
    # ---- the embedded dataset
    BadInput(
        "pydoc split",
        ["--training.dataset_split=test"],
        "--training.dataset_split='test': the embedded 'pydoc' dataset has the splits train, validation",
    ),
    BadInput(
        "pydoc validation split",
        ["--validation.enable=true", "--validation.dataset_split=valid"],
        "--validation.dataset_split='valid': the embedded 'pydoc' dataset has the splits train, validation"
        " (did you mean 'validation'?)",
    ),
    BadInput(
        "pydoc with a config name",
        ["--training.dataset_config_name=en"],
        "--training.dataset_config_name='en' has no effect on the embedded 'pydoc' dataset",
    ),
    BadInput(
        "pydoc smaller than a global batch",
        ["--training.local_batch_size=256", "--training.seq_len=64"],
        "--training.dataset='pydoc': split 'train' has 413 documents, fewer than the 512 rows of a global batch",
    ),
    # ---- local datasets
    BadInput(
        "text field missing",
        ["--training.dataset={dump}/data.jsonl", "--training.dataset_text_field=body"],
        "--training.dataset_text_field='body': document 0 of '{dump}/data.jsonl' has no such column; its columns are: text, id",
        setup=lambda d: _jsonl(d, "data.jsonl", _docs(8)),
    ),
    BadInput(
        "text field not a string",
        ["--training.dataset={dump}/data.jsonl"],
        "--training.dataset_text_field='text': document 0 of '{dump}/data.jsonl' holds int 5, not a string",
        setup=lambda d: _jsonl(d, "data.jsonl", [{"text": 5}] * 8),
    ),
    BadInput(
        "jsonl with a broken line",
        ["--training.dataset={dump}/data.jsonl"],
        "--training.dataset='{dump}/data.jsonl': cannot read the local file (line 2 is not JSON:",
        setup=lambda d: _write(d, "data.jsonl", '{"text": "a"}\n{"text": "b"\n'),
    ),
    BadInput(
        "empty dataset file",
        ["--training.dataset={dump}/data.jsonl"],
        "--training.dataset='{dump}/data.jsonl': no documents in split 'train' (the file is empty)",
        setup=lambda d: _write(d, "data.jsonl", ""),
    ),
    BadInput(
        "fewer documents than global batch rows",
        ["--training.dataset={dump}/data.jsonl"],
        "--training.dataset='{dump}/data.jsonl': split 'train' has 3 documents, fewer than the 8 rows of a global batch",
        setup=lambda d: _jsonl(d, "data.jsonl", _docs(3)),
    ),
    BadInput(
        "split of a local file",
        ["--training.dataset={dump}/data.jsonl", "--training.dataset_split=test"],
        "--training.dataset_split='test': the local file '{dump}/data.jsonl' has only the split 'train'",
        setup=lambda d: _jsonl(d, "data.jsonl", _docs(8)),
    ),
    BadInput(
        "split of a local folder",
        ["--training.dataset={dump}/data", "--training.dataset_split=test"],
        "--training.dataset_split='test': the local folder '{dump}/data' has only the split(s) train, validation",
        setup=lambda d: (
            _jsonl(d, "data/train.jsonl", _docs(8)),
            _jsonl(d, "data/validation.jsonl", _docs(8)),
        ),
    ),
    BadInput(
        "folder without data files",
        ["--training.dataset={dump}/data"],
        "--training.dataset='{dump}/data': the folder holds no data files",
        setup=lambda d: os.makedirs(os.path.join(d, "data")),
    ),
    BadInput(
        "corrupt parquet file",
        ["--training.dataset={dump}/data.parquet"],
        "--training.dataset='{dump}/data.parquet': cannot read the local file (ArrowInvalid: Parquet magic bytes not found",
        setup=lambda d: _write(d, "data.parquet", "PAR1 not really"),
    ),
    BadInput(
        "validation file keeps the default split",
        ["--validation.enable=true", "--validation.dataset={dump}/val.jsonl"],
        "--validation.dataset_split='validation': the local file '{dump}/val.jsonl' has only the split 'train';"
        " set --validation.dataset_split=train",
        setup=lambda d: _jsonl(d, "val.jsonl", _docs(8)),
    ),
    BadInput(
        "validation text field missing",
        [
            "--validation.enable=true",
            "--validation.dataset={dump}/val.jsonl",
            "--validation.dataset_split=train",
            "--validation.dataset_text_field=content",
        ],
        "--validation.dataset_text_field='content': document 0 of '{dump}/val.jsonl' has no such column; its columns are: body, id",
        setup=lambda d: _jsonl(d, "val.jsonl", _docs(8, field="body")),
    ),
    BadInput(
        "missing validation dataset path",
        ["--validation.enable=true", "--validation.dataset=./no/such/val.jsonl"],
        "--validation.dataset: local dataset path './no/such/val.jsonl' does not exist",
    ),
    # ---- pre-tokenized folders and mixtures
    BadInput(
        "tokenized folder missing a part file",
        ["--training.dataset={dump}/tokens"],
        "--training.dataset: '{dump}/tokens/part-00000.bin' is missing (the manifest lists it); re-run"
        " scripts/tokenize_dataset.py",
        setup=lambda d: _token_folder(d, "tokens", damage="missing"),
    ),
    BadInput(
        "tokenized folder with a truncated part",
        ["--training.dataset={dump}/tokens"],
        "--training.dataset: '{dump}/tokens/part-00000.bin' is truncated: 10 bytes, expected",
        setup=lambda d: _token_folder(d, "tokens", damage="truncated"),
    ),
    BadInput(
        "tokenized folder of another tokenizer",
        ["--training.dataset={dump}/tokens"],
        "--training.dataset: '{dump}/tokens' was tokenized with another tokenizer (tokenizer.json, fingerprint"
        " 0123456789ab) than this run's",
        setup=lambda d: _token_folder(d, "tokens", fingerprint="0123456789ab" * 5),
    ),
    BadInput(
        "tokenized folder with fewer documents than rows",
        ["--training.dataset={dump}/tokens"],
        "--training.dataset='{dump}/tokens': global batch row 3 of 8 gets no document (3 documents in 1 source"
        " shard(s))",
        setup=lambda d: _token_folder(d, "tokens", docs=3),
    ),
    BadInput(
        "mixture weight not positive",
        ["--training.dataset_mix=pydoc:0.5,{dump}/data.jsonl:0"],
        "--training.dataset_mix: entry '{dump}/data.jsonl:0': weight 0 must be a positive number",
        setup=lambda d: _jsonl(d, "data.jsonl", _docs(8)),
    ),
    BadInput(
        "mixture source missing",
        ["--training.dataset_mix=pydoc:0.5,{dump}/nope.jsonl:0.5"],
        "--training.dataset_mix entry '{dump}/nope.jsonl': local dataset path '{dump}/nope.jsonl' does not exist",
    ),
    BadInput(
        "mixture sources with different BOS/EOS",
        ["--training.dataset_mix={dump}/a:0.5,{dump}/b:0.5"],
        "--training.dataset_mix: its pre-tokenized sources delimit documents differently",
        setup=lambda d: (_token_folder(d, "a"), _token_folder(d, "b", bos_id=7)),
    ),
    BadInput(
        "mixture and dataset both set",
        ["--training.dataset={dump}/data.jsonl", "--training.dataset_mix=pydoc:1"],
        "--training.dataset='{dump}/data.jsonl' and --training.dataset_mix are both set",
        setup=lambda d: _jsonl(d, "data.jsonl", _docs(8)),
    ),
    BadInput(
        "negative loader workers",
        ["--training.dataloader.num_workers=-1"],
        "--training.dataloader.num_workers=-1: must be >= 0",
    ),
    # ---- hub datasets (offline here, so they fail at once)
    BadInput(
        "HF weights of another flavor",
        ["--checkpoint.initial_load_path={dump}/hf"],
        "--checkpoint.initial_load_path: '{dump}/hf' holds another model than llama3 debugmodel: hidden_size=128"
        " (ours: 256); pick the --model.flavor (and tokenizer) it was trained with",
        setup=lambda d: _hf_folder(d, hidden_size=128),
    ),
    BadInput(
        "HF weights incompletely downloaded",
        ["--checkpoint.initial_load_path={dump}/hf"],
        "'{dump}/hf/model.safetensors.index.json' names 1 missing file(s), e.g. 'model-2.safetensors';"
        " the download is incomplete",
        setup=lambda d: _hf_folder(d, missing_file=True),
    ),
    BadInput(
        "HF export would overwrite",
        ["--checkpoint.last_save_in_hf=true"],
        "--checkpoint.last_save_in_hf: '{dump}/hf/step-50' already exists (nothing is overwritten)",
        setup=lambda d: os.makedirs(os.path.join(d, "hf", "step-50")),
    ),
    BadInput(
        "DeepSeek-V3 folder with mscale != mscale_all_dim",
        [
            "--job.config_file=train_configs/deepseek_v3_debug.toml",
            "--checkpoint.initial_load_path={dump}/hf_in",
        ],
        "--checkpoint.initial_load_path: '{dump}/hf_in' cannot be loaded faithfully: rope_scaling.mscale=0.707"
        " != mscale_all_dim=1.0",
        setup=lambda d: _deepseek_folder(os.path.join(d, "hf_in"), mscale=0.707),
    ),
    BadInput(
        "Qwen3 MoE export with a routing bias",
        [
            "--job.config_file=train_configs/qwen3_moe_debug.toml",
            "--checkpoint.last_save_in_hf=true",
            "--moe.load_balance_coeff=1e-3",
        ],
        "--checkpoint.last_save_in_hf: --moe.load_balance_coeff=0.001 trains a routing bias that"
        " Qwen3MoeForCausalLM cannot hold",
    ),
    BadInput(
        "Qwen3 MoE TP above its KV heads",
        [
            "--job.config_file=train_configs/qwen3_moe_debug.toml",
            "--parallelism.tensor_parallel_degree=8",
            "--moe.aux_loss_coeff=0",
        ],
        "--parallelism.tensor_parallel_degree=8 does not divide qwen3 debugmodel_moe n_kv_heads=4",
        ngpu=8,
    ),
    BadInput(
        "validation every 0 steps",
        ["--validation.enable=true", "--validation.freq=0"],
        "--validation.freq=0: must be >= 1",
    ),
    BadInput(
        "profile every 0 steps",
        ["--profiling.enable_profiling=true", "--profiling.profile_freq=0"],
        "--profiling.profile_freq=0: must be >= 1",
    ),
    BadInput(
        "trace folder is a file",
        ["--profiling.enable_profiling=true", "--profiling.save_traces_folder=traces"],
        "--profiling.save_traces_folder: '{dump}/traces' is a file; give a folder name",
        setup=lambda d: open(os.path.join(d, "traces"), "w").close(),
    ),
    BadInput(
        "rank log folder is a file",
        [],
        "TORCHRUN_LOG_DIR='/dev/null' is not a folder",
        env={"TORCHRUN_LOG_DIR": "/dev/null"},
    ),
    BadInput(
        "hub dataset unreachable",
        ["--training.dataset=allenai/c4", "--training.dataset_config_name=en"],
        "--training.dataset='allenai/c4': cannot reach the Hugging Face hub: offline mode is on"
        " (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE); unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE to stream it,"
        " or use a local file or 'pydoc'",
        env=OFFLINE,
    ),
    BadInput(
        "hang timeout too close to the collective timeout",
        ["--comm.hang_timeout_seconds=300"],
        "--comm.hang_timeout_seconds=300: must be auto, 0 (off) or seconds (1..238 with"
        " --comm.timeout_seconds=300",
    ),
    BadInput(
        "async checkpoints without checkpoints",
        ["--checkpoint.async_mode=async"],
        "--checkpoint.async_mode=async has no effect without --checkpoint.enable=true",
    ),
    BadInput(
        "bad fault injection",
        [],
        "TORCHTITAN_FAULT: 'freeze@data': use stop@<point> or sleep=<seconds>@<point>",
        env={"TORCHTITAN_FAULT": "freeze@data"},
    ),
    BadInput(
        "validation hub dataset unreachable",
        [
            "--validation.enable=true",
            "--validation.dataset=wikitext",
            "--validation.dataset_config_name=wikitext-2-raw-v1",
        ],
        "--validation.dataset='wikitext': cannot reach the Hugging Face hub: offline mode is on",
        env=OFFLINE,
    ),
]


def snapshot(folder: str) -> dict[str, str]:
    """Every file under folder -> hash of its bytes (and its mtime), to prove nothing changed."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.isdir(path):
                out[rel + "/"] = ""
            else:
                with open(path, "rb") as f:
                    out[rel] = f"{hashlib.sha256(f.read()).hexdigest()} {os.stat(path).st_mtime_ns}"
    return out


def run_case(case: BadInput, dump: str) -> tuple[int, list[str], dict, dict]:
    """Run the case against a dump folder that already holds a previous run's files."""
    os.makedirs(dump, exist_ok=True)
    with open(os.path.join(dump, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "loss": 9.0}\n')
    if case.setup:
        case.setup(dump)
    before = snapshot(dump)
    env = {**os.environ, "NGPU": str(case.ngpu), **case.env}
    args = [a.replace("{dump}", dump) for a in case.args]
    proc = subprocess.run(
        [run_tests.RUN_TRAIN, *args, f"--job.dump_folder={dump}"],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, lines, before, snapshot(dump)


def expected(case: BadInput, dump: str) -> str:
    return case.expect.replace("{dump}", dump)


def main() -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(CASES):
            dump = os.path.join(tmp, f"case{i}")
            rc, lines, before, after = run_case(case, dump)
            ok = (
                rc == 2
                and len(lines) == 1
                and lines[0].startswith("error: ")
                and expected(case, dump) in lines[0]
                and before == after
            )
            failed += not ok
            env = "".join(f"{k}={v} " for k, v in case.env.items())
            print(
                f"[{'ok' if ok else 'FAIL'}] {case.name} ({env}NGPU={case.ngpu} {' '.join(case.args)}): exit {rc}, "
                f"dump folder {'unchanged' if before == after else 'CHANGED'}"
            )
            for line in lines:
                print(f"    {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
