"""Hugging Face safetensors weights in and out of (possibly parallelized) model parts.

In: every rank reads, one tensor at a time, the full Hugging Face tensors of the
parameters it holds, converts them (the model's converter: names, RoPE row order) and
keeps its own shard (`copy_full_into`), so any layout (FSDP, HSDP, TP, PP, SimpleFSDP)
starts from the same weights without a collective.

Out: the ranks of each pipeline stage gather their parameters one at a time
(`full_tensor`); the stage's first rank converts them and writes safetensors files of at
most `shard_bytes`; rank 0 writes the index, config.json and tokenizer.json, then renames
the folder into place, so a crash never leaves a folder that looks complete.
"""

import json
import os
import shutil
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan.dtypes import DTYPES
from torchtitan.messages import one_line
from torchtitan.models.common.init import clean_fqn, local_indices
from torchtitan.models.hf.converters import hf_converter
from torchtitan.models.hf.folder import CONFIG, INDEX, resolve_names, weight_map
from torchtitan.units import GIB

SHARD_BYTES = 4 * GIB


@dataclass(frozen=True)
class HFSpec:
    """What a run needs to read and write Hugging Face folders of its model."""

    model_name: str
    args: object  # the flavor's args with this run's vocabulary and the flavor's context length
    bos_id: int
    eos_id: int
    tokenizer_file: str
    writes: bool  # this rank writes its pipeline stage's files (one rank per stage)
    stage: int  # pipeline rank


FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def dequantize_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, row0: int = 0, col0: int = 0, block: int = 128
) -> torch.Tensor:
    """float32 of an FP8 weight region whose first element is (row0, col0) of the full tensor:
    each element times the `scale_inv` of its block x block tile. `scale_inv` holds the tiles
    from tile row0 // block and tile column col0 // block on (the tiles the region touches)."""
    rows = (torch.arange(weight.shape[0]) + row0) // block - row0 // block
    cols = (torch.arange(weight.shape[1]) + col0) // block - col0 // block
    return weight.to(torch.float32) * scale_inv.to(torch.float32)[rows][:, cols]


class FolderReader:
    """Reads tensors, or only the index ranges a rank holds (safetensors slices: the bytes
    of the other rows are never read), from a Hugging Face folder; FP8 weights with a
    `<name>_scale_inv` are dequantized block-wise to float32. Counts the bytes read."""

    def __init__(
        self, wmap: dict[str, str], sources: dict[str, str] | None = None, block: int = 128
    ):
        self.wmap, self.sources, self.block = wmap, sources or {}, block
        self.handles: dict[str, object] = {}
        self.bytes_read = 0

    def close(self) -> None:
        for h in self.handles.values():
            h.__exit__(None, None, None)
        self.handles = {}

    def stored(self, name: str) -> str:
        return self.sources.get(name, name)

    def has(self, name: str) -> bool:
        return self.stored(name) in self.wmap

    def _slice(self, stored: str):
        from safetensors import safe_open

        file = self.wmap[stored]
        if file not in self.handles:
            self.handles[file] = safe_open(file, framework="pt", device="cpu").__enter__()
        return self.handles[file].get_slice(stored)

    def _region(self, stored: str, ranges: list[tuple[int, int]]) -> torch.Tensor:
        part = self._slice(stored)[tuple(slice(lo, hi) for lo, hi in ranges)]
        self.bytes_read += part.numel() * part.element_size()
        return part

    def read(self, name: str, index=None) -> torch.Tensor:
        """The tensor `name` (stored dtype; FP8 -> float32), or its part at `index`: per dim a
        1-D tensor of global indices (None: the whole dim), in the order they are wanted."""
        stored = self.stored(name)
        shape = self._slice(stored).get_shape()
        index = (
            [None] * len(shape)
            if index is None
            else list(index) + [None] * (len(shape) - len(index))
        )
        index = [None if ix is None else ix.to("cpu", torch.int64) for ix in index]
        ranges = [
            (0, n)
            if ix is None or ix.numel() == 0 and n == 0
            else ((int(ix.min()), int(ix.max()) + 1) if ix.numel() else (0, 0))
            for ix, n in zip(index, shape)
        ]
        part = self._region(stored, ranges)
        if part.dtype in FP8_DTYPES:
            scale = stored + "_scale_inv"
            if scale not in self.wmap or part.dim() != 2:
                raise ValueError(
                    f"'{stored}' is {part.dtype} without a 2-D '{scale}' to dequantize it with"
                )
            (r0, r1), (c0, c1) = ranges
            b = self.block
            tiles = self._region(
                scale, [(r0 // b, max(r1 - 1, r0) // b + 1), (c0 // b, max(c1 - 1, c0) // b + 1)]
            )
            part = dequantize_blocks(part, tiles, r0, c0, b)
        for d, (ix, (lo, hi)) in enumerate(zip(index, ranges)):
            if ix is not None and not (
                ix.numel() == hi - lo and torch.equal(ix, torch.arange(lo, hi))
            ):
                part = part.index_select(d, ix - lo)
        return part


@dataclass(frozen=True)
class HFLoad:
    """What a rank read from a Hugging Face folder."""

    tensors: int  # parameters (and checkpointed buffers) filled
    bytes_read: int  # bytes of tensor data this rank read (its shards' rows only, where sliced)
    note: str = ""  # one line about what the folder held that the run leaves out


def checkpointed_tensors(part, converter):
    """(clean name, tensor) of every parameter and of the buffers the converter reads/writes."""
    buffers = getattr(converter, "BUFFERS", None)
    for name, param in part.named_parameters():
        yield clean_fqn(name), param
    if buffers is not None:
        for name, buf in part.named_buffers():
            if buffers.search(clean_fqn(name)):
                yield clean_fqn(name), buf


@torch.no_grad()
def load_hf_weights(
    model_parts, path: str, model_name: str, args, key: str = "--checkpoint.initial_load_path"
) -> HFLoad:
    """Overwrite every parameter of `model_parts` from the Hugging Face folder `path`; each
    rank reads only the parts it holds (the experts and rows of its shards). The folder was
    checked by models/hf/folder.check_folder."""
    from torchtitan.models.hf.folder import read_config, skip_note

    converter = hf_converter(model_name)
    wmap = weight_map(path, key)
    reader = FolderReader(wmap, resolve_names(converter, args, wmap, path, key))
    try:
        count = 0
        for part in model_parts:
            for fqn, param in checkpointed_tensors(part, converter):
                if isinstance(param, DTensor):
                    index = [local_indices(param, d).cpu() for d in range(param.dim())]
                    target = param.to_local()
                else:
                    index, target = None, param
                local = converter.read_local(fqn, args, reader, index)
                target.copy_(local.to(device=target.device, dtype=target.dtype))
                count += 1
        return HFLoad(
            count, reader.bytes_read, skip_note(converter, args, wmap, read_config(path, key)) or ""
        )
    finally:
        reader.close()


class ShardWriter:
    """Converted tensors -> safetensors files of at most `shard_bytes` named `<prefix>-NNNN`.

    A write that fails (disk full, folder not visible) is kept as `error` and later tensors
    are dropped, so a writer that also gathers keeps taking part in its stage's collectives."""

    def __init__(self, folder: str, prefix: str, shard_bytes: int):
        self.folder, self.prefix, self.shard_bytes = folder, prefix, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.total_bytes = 0
        self.error = ""

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self.error:
            return
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + nbytes > self.shard_bytes:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += nbytes
        self.total_bytes += nbytes

    def flush(self) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        if not self.pending or self.error:
            return
        file = f"{self.prefix}-{len(set(self.weight_map.values())):04d}.safetensors"
        try:
            save_file(self.pending, os.path.join(self.folder, file), metadata={"format": "pt"})
        except (OSError, SafetensorError) as e:  # safetensors wraps its I/O errors in its own
            self.error = f"writing {file} failed ({type(e).__name__}: {one_line(e, 160)})"
        self.weight_map.update({name: file for name in self.pending})
        self.pending, self.pending_bytes = {}, 0


def write_metadata(
    folder: str,
    config: dict,
    weight_map: dict[str, str],
    total_bytes: int,
    tokenizer_file: str | None,
) -> None:
    """The index, config.json and (if given) tokenizer.json beside the weights."""
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump(
            {
                "metadata": {"total_size": total_bytes},
                "weight_map": dict(sorted(weight_map.items())),
            },
            f,
            indent=2,
        )
    with open(os.path.join(folder, CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    if tokenizer_file:
        shutil.copyfile(tokenizer_file, os.path.join(folder, "tokenizer.json"))


def convert_full(tensors, model_name: str, args, dtype: str, writer: ShardWriter) -> None:
    """(our name, full tensor) pairs -> converted, cast and handed to `writer` (a model with
    multi-token prediction also gets the published copies of its embedding and head)."""
    converter = hf_converter(model_name)
    shared = {}
    for fqn, full in tensors:
        if fqn in ("tok_embeddings.weight", "output.weight"):
            shared[fqn] = full
        for name, hf in converter.export_tensors(fqn, full, args):
            writer.add(name, hf.to(device="cpu", dtype=DTYPES[dtype]).contiguous())
    copies = getattr(converter, "mtp_copies", None)
    if copies is not None and args.mtp_depth:
        for name, hf in copies(args, shared):
            writer.add(name, hf.to(device="cpu", dtype=DTYPES[dtype]).contiguous())
    writer.flush()


def _full_parameters(model_parts, keep: bool, converter):
    """(clean name, full tensor) for every parameter; DTensors are gathered on every rank
    of their mesh (a collective), plain tensors are taken as they are. With keep=False the
    gathered tensor is dropped at once (ranks that help gather but do not write)."""
    for part in model_parts:
        for fqn, param in checkpointed_tensors(part, converter):
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            if keep:
                yield fqn, full


@torch.no_grad()
def export_hf(model_parts, folder: str, spec: HFSpec, dtype: str, group=None) -> str:
    """Write the weights of every rank's parts as the Hugging Face folder `folder`. Collective
    over the world (call on every rank); `group` (default: the world) synchronises the file
    work. A failure on any rank (folder not shared, disk full, target taken) raises
    HFExportError on every rank, after every rank has finished its gathers (an error of
    rank 0's own code rather than of the files is raised there as it is, with its traceback)."""
    rank = dist.get_rank()
    tmp = folder + ".tmp"
    if rank == 0:
        shutil.rmtree(
            tmp, ignore_errors=True
        )  # a crashed export's leftovers, never a finished folder
        os.makedirs(tmp)
    dist.barrier(group=group)
    writer = ShardWriter(tmp, f"model-pp{spec.stage:02d}", SHARD_BYTES)
    if spec.writes and not os.path.isdir(tmp):
        writer.error = f"'{tmp}' made by rank 0 is not visible here: put --job.dump_folder on a file system every node shares"
    params = _full_parameters(model_parts, spec.writes, hf_converter(spec.model_name))
    if spec.writes:
        convert_full(params, spec.model_name, spec.args, dtype, writer)
    else:
        for _ in params:  # gather along with the writer, drop the result
            pass
    pieces = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        pieces, (writer.weight_map, writer.total_bytes, writer.error), group=group
    )
    errors = [f"rank {r}: {e}" for r, (_, _, e) in enumerate(pieces) if e]
    bug = None  # rank 0's own fault: raised as it is once every rank has the error
    if rank == 0 and not errors:
        try:
            wmap = {k: v for m, _, _ in pieces for k, v in m.items()}
            config = hf_converter(spec.model_name).hf_config(
                spec.args, dtype, spec.bos_id, spec.eos_id
            )
            write_metadata(tmp, config, wmap, sum(b for _, b, _ in pieces), spec.tokenizer_file)
            if os.path.exists(folder):
                raise FileExistsError(f"'{folder}' appeared meanwhile (nothing is overwritten)")
            os.replace(tmp, folder)
        except OSError as e:  # the folder cannot be written, or its name is taken
            errors.append(f"rank 0: {type(e).__name__}: {one_line(e, 160)}")
        except Exception as e:  # broad on purpose: the others must not wait on the broadcast
            errors.append(f"rank 0: {type(e).__name__}: {one_line(e, 160)}")
            bug = e
    box = [errors]
    dist.broadcast_object_list(box, src=0, group=group)
    if box[0]:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if bug is not None:
            raise bug
        raise HFExportError(
            f"--checkpoint.last_save_in_hf: the Hugging Face export to '{folder}' failed ({box[0][0]});"
            " the weights are in the checkpoint, export them with scripts/convert_hf.py"
        )
    return folder


class HFExportError(RuntimeError):
    """An export that failed on some rank; raised alike on every rank, one line."""
