"""Read an offline W&B run without the network: its transaction log <run dir>/run-<id>.wandb.

wandb >= 0.31 writes the offline run's history, summary and config only into that file (no
files/wandb-summary.json until `wandb sync`), and no longer ships a Python reader for it. The
format: a 7-byte header (":W&B", 0xBEE1 little-endian, version 0), then LevelDB-log records
in 32 KiB blocks: crc32 (4 bytes), length (2), type (1: full, 2: first, 3: middle, 4: last),
the payload; a block's tail shorter than a record header is padding. Each whole payload is a
wandb.proto Record (protobuf, shipped with wandb).
"""

import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7


def records(path: str):
    """The Record protobufs of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    magic, version = struct.unpack("<HB", data[4:HEADER])
    assert data[:4] == b":W&B" and magic == 0xBEE1 and version == 0, (
        f"{path}: not a W&B log ({data[:HEADER]!r})"
    )
    pos, payload = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # zero padding: the end of what was written
            break
        payload += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def read_run(run_dir: str) -> dict:
    """{"history": [{key: value} per step, with "_step"], "summary": {key: last value},
    "config": {key: value}, "exit_code": int or None, "name": str, "project": str}."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    out = {"history": [], "summary": {}, "config": {}, "exit_code": None, "name": "", "project": ""}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["project"] = record.run.display_name, record.run.project
            for item in record.run.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][_key(item)] = json.loads(item.value_json)
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out
