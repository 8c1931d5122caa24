"""How many bytes each rank reads when a job starts from a Hugging Face folder, computed
from the flavor's shapes and the job's layout without the folder (an index file holds
names, not shapes): the converter's own `read_local` runs against a reader that knows the
shapes and counts what FolderReader would read (the same row ranges; FP8: one byte per
weight plus the float32 scales of the 128 x 128 tiles the rows touch).
"""

import torch
from torch.distributed.tensor import DTensor

from torchtitan.models.common.init import local_indices
from torchtitan.models.hf.converters import hf_converter


class PlannedReader:
    """FolderReader's interface over shapes alone: returns zeros, counts bytes."""

    def __init__(
        self, shapes: dict[str, tuple[int, ...]], element_bytes: int, fp8: bool, block: int = 128
    ):
        self.shapes, self.element_bytes, self.fp8, self.block = shapes, element_bytes, fp8, block
        self.bytes_read = 0

    def has(self, name: str) -> bool:
        return name in self.shapes

    def read(self, name: str, index=None) -> torch.Tensor:
        shape = self.shapes[name]
        index = (
            [None] * len(shape)
            if index is None
            else list(index) + [None] * (len(shape) - len(index))
        )
        ranges = [
            (0, n) if ix is None else ((int(ix.min()), int(ix.max()) + 1) if ix.numel() else (0, 0))
            for ix, n in zip(index, shape)
        ]
        numel = 1
        for lo, hi in ranges:
            numel *= hi - lo
        # FP8 checkpoints quantize the 2-D projection weights; norms, router, embeddings stay bf16
        quantized = self.fp8 and len(shape) == 2 and _quantized(name)
        self.bytes_read += numel * (1 if quantized else self.element_bytes)
        if quantized:
            b = self.block
            (r0, r1), (c0, c1) = ranges
            tiles = (max(r1 - 1, r0) // b + 1 - r0 // b) * (max(c1 - 1, c0) // b + 1 - c0 // b)
            self.bytes_read += 4 * tiles
        return torch.zeros(
            [n if ix is None else ix.numel() for ix, n in zip(index, shape)], device="meta"
        )


def _quantized(name: str) -> bool:
    return ".layers." in name and name.endswith("proj.weight") and "gate.weight" not in name


def planned_bytes(
    model_parts, model_name: str, args, element_bytes: int = 2, fp8: bool = False
) -> int:
    """Bytes this rank's `model_parts` (planned and parallelized, e.g. on meta) would read."""
    from torchtitan.models.hf.weights import checkpointed_tensors

    converter = hf_converter(model_name)
    reader = PlannedReader(converter.hf_shapes(args), element_bytes, fp8)
    for part in model_parts:
        for fqn, param in checkpointed_tensors(part, converter):
            index = (
                [local_indices(param, d).cpu() for d in range(param.dim())]
                if isinstance(param, DTensor)
                else None
            )
            converter.read_local(fqn, args, reader, index)
    return reader.bytes_read


def folder_bytes(model_name: str, args, element_bytes: int = 2, fp8: bool = False) -> int:
    """Bytes of all the weights a run reads, as one rank reading everything would."""
    converter = hf_converter(model_name)
    reader = PlannedReader(converter.hf_shapes(args), element_bytes, fp8)
    for name in (
        converter.required(args, set(reader.shapes))
        if hasattr(converter, "required")
        else reader.shapes
    ):
        reader.read(name)
    return reader.bytes_read
