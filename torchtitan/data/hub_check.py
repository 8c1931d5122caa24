"""The pre-launch check of a hub dataset (the hub kind of data/kinds.py), torch-free: it is
opened as the run will open it (streaming) and its first record is read, in a thread, so a
hanging network costs at most HUB_TIMEOUT_S. A fault of the input (no network, no such
dataset, config or split) is one ConfigError line; a bug of ours keeps its traceback.
"""

from __future__ import annotations

import os
import threading

from torchtitan.config.manager import ConfigError, suggest
from torchtitan.data.dataset_checks import (
    DatasetCheck,
    QuietHF,
    check_text,
    first_streamed,
    listed,
)
from torchtitan.data.input_errors import input_fault
from torchtitan.data.sources import DatasetKeys, stream_hub
from torchtitan.messages import one_line

HUB_TIMEOUT_S = 60.0  # how long the hub may take to give the first record of a dataset
OTHER_SOURCE = "or use a local file or 'pydoc'"


def read_records(keys: DatasetKeys, limit: int) -> list:
    """The first `limit` records of the hub dataset, streamed as the run streams it."""
    return first_streamed(stream_hub, keys, limit)


def check_hub(c: DatasetCheck) -> None:
    # A dry run reads no data; one hub request per job: rank 0 (or run_train.sh's check).
    if c.dry_run or os.environ.get("RANK", "0") != "0":
        return
    k = c.keys
    result: dict = {}

    def read():
        try:
            result["records"] = read_records(k, 1)
        except BaseException as e:  # noqa: BLE001 -- a thread hands over all it raised: judged below
            result["error"] = e

    quiet = QuietHF()
    thread = threading.Thread(target=read, name="hub-dataset-check", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S)
    if thread.is_alive():
        raise ConfigError(
            f"--{k.section}.dataset={k.dataset!r}: no answer from the Hugging Face hub within"
            f" {HUB_TIMEOUT_S:g} s; check the network (proxy, HF_ENDPOINT), {OTHER_SOURCE}"
        )
    quiet.restore()
    if "error" in result:
        error = result["error"]
        if not input_fault(error):
            raise error  # a bug of ours: the thread's traceback
        raise ConfigError(hub_error(k, error))
    if not result["records"]:
        raise ConfigError(
            f"--{k.section}.dataset={k.dataset!r}: the hub dataset has no documents in split"
            f" '{k.split}'; pick another --{k.section}.dataset_split, {OTHER_SOURCE}"
        )
    check_text(k, result["records"])


def _offline_vars() -> list[str]:
    return [
        v
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        if os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
    ]


def hub_error(k: DatasetKeys, e: BaseException) -> str:
    """The one line of a fault of the input met while streaming a hub dataset."""
    msg, kind = one_line(e), type(e).__name__
    key, section, name, config = (
        f"--{k.section}.dataset={k.dataset!r}",
        k.section,
        k.dataset,
        k.config_name,
    )
    if (
        isinstance(e, ConnectionError)
        or "OfflineModeIsEnabled" in msg
        or kind == "OfflineModeIsEnabled"
    ):
        offline = _offline_vars()
        if offline:
            return (
                f"{key}: cannot reach the Hugging Face hub: offline mode is on ({', '.join(offline)});"
                f" unset {' and '.join(offline)} to stream it, {OTHER_SOURCE}"
            )
        return (
            f"{key}: cannot reach the Hugging Face hub ({msg}); check the network (proxy, HF_ENDPOINT),"
            f" {OTHER_SOURCE}"
        )
    if kind == "DatasetNotFoundError":
        return (
            f"{key}: {msg.rstrip('.')}; check the name (owner/name as on huggingface.co/datasets), and set"
            f" HF_TOKEN for a gated or private dataset (after accepting its terms), {OTHER_SOURCE}"
        )
    if msg.startswith("Config name is missing"):
        return (
            f"--{section}.dataset_config_name={config!r}: the hub dataset '{name}' has several configs"
            f" ({listed(msg, 'available configs:')}); set --{section}.dataset_config_name to one of them"
        )
    if msg.startswith("BuilderConfig"):
        have = listed(msg, "Available:")
        return (
            f"--{section}.dataset_config_name={config!r}: the hub dataset '{name}' has no such config"
            f"{suggest(config, have.split(', '))} (it has: {have}); set --{section}.dataset_config_name to one of them"
        )
    if msg.startswith("Bad split"):
        have = listed(msg, "Available splits:")
        return (
            f"--{section}.dataset_split={k.split!r}: the hub dataset '{name}' has no such split"
            f"{suggest(k.split, have.split(', '))} (it has: {have}); set --{section}.dataset_split to one of them"
        )
    reason = msg if kind in msg else f"{kind}: {msg}"
    return (
        f"{key}: cannot stream it from the Hugging Face hub ({reason}); check the name, the"
        f" --{section}.dataset_config_name and dataset_split, the network and HF_TOKEN, {OTHER_SOURCE}"
    )
