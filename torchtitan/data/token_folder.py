"""Pre-tokenized folders: the format, its torch-free check, and random-access reads.

A folder written by scripts/tokenize_dataset.py holds, in the source's document order:

    manifest.json       format, tokenizer fingerprint + BOS/EOS, dtype, counts, the files, and
                        the documents per *source* shard (so the slot rule of data/slots.py maps
                        documents exactly as it does for the raw source)
    part-00000.bin      token ids of the documents, back to back, little-endian uint16 (when the
                        vocabulary fits) or uint32: a plain array numpy can memmap
    part-00000.idx      int64 offsets into the .bin, one per document plus the end

Each document is stored as the run's tokenizer encodes it for training (BOS + text + EOS, or
text + EOS for a tokenizer without BOS), so windows are packed exactly as from the raw text.
Reads use pread, not a memmap: a file truncated after the check is then one DataError line
naming the file and the document, never a SIGBUS.
"""

from __future__ import annotations

import json
import os

MANIFEST = "manifest.json"
FORMAT = "torchtitan.tokens"
VERSION = 1
DTYPES = {"uint16": 2, "uint32": 4}


class FolderError(ValueError):
    """A folder that is not a complete tokenized dataset; the message is one line, without the key."""


def is_token_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(os.path.expanduser(path), MANIFEST))


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def part_name(index: int) -> str:
    return f"part-{index:05d}"


def read_manifest(folder: str) -> dict:
    path = os.path.join(os.path.expanduser(folder), MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except OSError as e:
        raise FolderError(f"cannot read '{path}' ({e.strerror or e})") from None
    except ValueError as e:
        raise FolderError(f"'{path}' is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FolderError(f"'{path}' is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise FolderError(
            f"'{path}' has format version {manifest.get('version')}, this build reads {VERSION}"
        )
    return manifest


def check_folder(folder: str, tokenizer_fingerprint: str | None = None) -> dict:
    """The manifest, once every file it names is present with the size its counts imply and
    (when given) the tokenizer is the run's; FolderError otherwise. Reads no token."""
    m = read_manifest(folder)
    root = os.path.expanduser(folder)
    width = DTYPES.get(m.get("dtype"))
    if width is None:
        raise FolderError(
            f"'{os.path.join(root, MANIFEST)}' names dtype {m.get('dtype')!r}, not one of {list(DTYPES)}"
        )
    docs = tokens = 0
    for entry in m["files"]:
        for ext, size in ((".bin", entry["tokens"] * width), (".idx", (entry["docs"] + 1) * 8)):
            path = os.path.join(root, entry["name"] + ext)
            if not os.path.isfile(path):
                raise FolderError(
                    f"'{path}' is missing (the manifest lists it); re-run scripts/tokenize_dataset.py"
                )
            have = os.path.getsize(path)
            if have != size:
                raise FolderError(
                    f"'{path}' is {'truncated' if have < size else 'longer than the manifest says'}: {have} bytes,"
                    f" expected {size}; re-run scripts/tokenize_dataset.py"
                )
        docs, tokens = docs + entry["docs"], tokens + entry["tokens"]
    if docs != m["docs"] or tokens != m["tokens"] or sum(m["source_shards"]) != docs:
        raise FolderError(
            f"'{os.path.join(root, MANIFEST)}' counts do not add up; re-run scripts/tokenize_dataset.py"
        )
    if docs == 0:
        raise FolderError(f"'{root}' holds no documents")
    if tokenizer_fingerprint is not None and m["tokenizer"]["fingerprint"] != tokenizer_fingerprint:
        raise FolderError(
            f"'{root}' was tokenized with another tokenizer ({m['tokenizer'].get('path', '?')}, fingerprint"
            f" {m['tokenizer']['fingerprint'][:12]}) than this run's (fingerprint {tokenizer_fingerprint[:12]});"
            " set --model.tokenizer_path to that tokenizer, or re-tokenize with this one"
        )
    return m


class TokenFolder:
    """Random access to a checked folder's documents by (source shard, index in it)."""

    kind = "tokenized"

    def __init__(self, folder: str, manifest: dict | None = None):
        import numpy as np

        self.np = np
        self.root = os.path.expanduser(folder)
        self.manifest = manifest or read_manifest(folder)
        self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self.width = self.dtype.itemsize
        self.files = self.manifest["files"]
        self.file_starts = np.cumsum(
            [0] + [f["docs"] for f in self.files]
        )  # first global doc of each file
        self.shard_starts = np.cumsum([0] + list(self.manifest["source_shards"]))
        self.num_shards = len(self.manifest["source_shards"])
        self._fds: dict[int, tuple[int, int]] = {}  # file index -> (bin fd, idx fd)
        self.bytes_read = 0

    def __getstate__(self):  # worker processes open their own descriptors
        state = dict(self.__dict__)
        state["_fds"], state["np"] = {}, None
        return state

    def __setstate__(self, state):
        import numpy as np

        self.__dict__.update(state)
        self.np = np

    def shard_size(self, shard: int) -> int:
        return int(self.manifest["source_shards"][shard])

    def _open(self, f: int) -> tuple[int, int]:
        if f not in self._fds:
            name = os.path.join(self.root, self.files[f]["name"])
            self._fds[f] = (
                os.open(name + ".bin", os.O_RDONLY),
                os.open(name + ".idx", os.O_RDONLY),
            )
        return self._fds[f]

    def where(self, shard: int, index: int) -> str:
        return f"document {int(self.shard_starts[shard]) + index} of '{self.root}'"

    def tokens(self, shard: int, index: int, epoch: int = 0):
        """The document's token ids (numpy), or None past the shard's end."""
        if index >= self.shard_size(shard):
            return None
        doc = int(self.shard_starts[shard]) + index
        f = int(self.np.searchsorted(self.file_starts, doc, side="right")) - 1
        local = doc - int(self.file_starts[f])
        bin_fd, idx_fd = self._open(f)
        name = os.path.join(self.root, self.files[f]["name"])
        raw = os.pread(idx_fd, 16, local * 8)
        if len(raw) != 16:
            raise TruncatedShard(name + ".idx", doc)
        start, end = self.np.frombuffer(raw, "<i8")
        nbytes = int(end - start) * self.width
        data = os.pread(bin_fd, nbytes, int(start) * self.width)
        if len(data) != nbytes:
            raise TruncatedShard(name + ".bin", doc)
        self.bytes_read += 16 + nbytes
        return self.np.frombuffer(data, self.dtype)

    def close(self) -> None:
        for fds in self._fds.values():
            for fd in fds:
                os.close(fd)
        self._fds = {}


class TruncatedShard(OSError):
    def __init__(self, path: str, doc: int):
        self.path, self.doc = path, doc
        super().__init__(f"'{path}' ends before document {doc}")
