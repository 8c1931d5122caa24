"""A Hugging Face model folder on disk: config.json + safetensors files (one, several with
`model.safetensors.index.json`, or several without an index). Torch-free, so the config
check can verify a folder's shapes against the flavor before any process group starts.
"""

import glob
import json
import os

from torchtitan.messages import one_line

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"


class HFFolderError(ValueError):
    """A Hugging Face folder that cannot start this model; the message is one line."""


def is_hf_folder(path: str) -> bool:
    """A folder with a config.json and safetensors weights (not a DCP checkpoint)."""
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, CONFIG))
        and (
            os.path.isfile(os.path.join(path, INDEX))
            or bool(glob.glob(os.path.join(path, "*.safetensors")))
        )
    )


def read_config(path: str, key: str) -> dict:
    file = os.path.join(path, CONFIG)
    try:
        with open(file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise HFFolderError(
            f"{key}: cannot read '{file}' ({type(e).__name__}: {one_line(e, 120)}); give a Hugging"
            " Face model folder with a valid config.json"
        ) from None
    if not isinstance(config, dict):
        raise HFFolderError(
            f"{key}: '{file}' is not a JSON object; give a Hugging Face model folder"
        )
    return config


def weight_map(path: str, key: str) -> dict[str, str]:
    """Tensor name -> the safetensors file (full path) holding it."""
    from safetensors import SafetensorError, safe_open

    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                names = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HFFolderError(
                f"{key}: cannot read '{index}' ({type(e).__name__}); it needs a"
                ' "weight_map" of tensor name -> file'
            ) from None
        out = {name: os.path.join(path, file) for name, file in names.items()}
        missing = sorted({f for f in out.values() if not os.path.isfile(f)})
        if missing:
            raise HFFolderError(
                f"{key}: '{index}' names {len(missing)} missing file(s), e.g."
                f" '{os.path.basename(missing[0])}'; the download is incomplete"
            )
        return out
    out = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        try:
            with safe_open(file, framework="numpy") as f:
                out.update({name: file for name in f.keys()})
        except (OSError, SafetensorError) as e:  # unreadable; a header that does not parse
            raise HFFolderError(
                f"{key}: '{file}' is not a readable safetensors file ({one_line(e, 120)})"
            ) from None
    return out


def tensor_shapes(wmap: dict[str, str], names, key: str) -> dict[str, tuple[int, ...]]:
    """Shapes of `names` read from the safetensors headers (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(wmap[name], []).append(name)
    shapes = {}
    for file, file_names in by_file.items():
        try:
            with safe_open(file, framework="numpy") as f:
                for name in file_names:
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (OSError, SafetensorError) as e:  # also: the file lacks a tensor named
            raise HFFolderError(
                f"{key}: '{file}' is not a readable safetensors file or lacks a tensor its"
                f" index names ({one_line(e, 120)})"
            ) from None
    return shapes


def required_shapes(converter, args, available) -> dict[str, tuple[int, ...]]:
    """The tensors (and shapes) a folder holding `available` names must have for `args`."""
    if hasattr(converter, "required"):
        return converter.required(args, available)
    return converter.hf_shapes(args)


def resolve_names(converter, args, wmap: dict[str, str], path: str, key: str) -> dict[str, str]:
    """Every tensor the model needs -> the name it is stored under (tied models: the embedding)."""
    out = {}
    for name in required_shapes(converter, args, wmap):
        source = name if name in wmap else converter.TIED_FALLBACK.get(name)
        if source not in wmap:
            raise HFFolderError(
                f"{key}: '{path}' has no tensor '{name}'; it is not a complete checkpoint of"
                " this model"
            )
        out[name] = source
    return out


def skip_note(converter, args, wmap, config: dict) -> str | None:
    """One line about tensors the run leaves out on purpose (DeepSeek-V3: MTP layers)."""
    note = getattr(converter, "skip_note", None)
    return note(wmap, args, config) if note is not None else None


def _left_out(converter, args, config: dict):
    """name -> True for stored tensors that are no weights or that the run skips on purpose."""
    unread = converter.unread(args) if hasattr(converter, "unread") else None
    skipped = getattr(converter, "is_skipped", None)

    def test(name: str) -> bool:
        return bool(
            converter.IGNORED.search(name)
            or (unread is not None and unread.search(name))
            or (skipped is not None and skipped(name, args, config))
        )

    return test


def folder_rules(path: str, model_name: str) -> dict:
    """What a Hugging Face folder fixes beyond the shapes (its converter's rules_from_config:
    DeepSeek-V3's YaRN rule), as args fields; {} when the model has no converter or the folder
    cannot be read (check_folder reports that)."""
    from torchtitan.models.hf.converters import hf_converter

    try:
        rules = getattr(hf_converter(model_name), "rules_from_config", None)
        return (
            rules(read_config(path, "--checkpoint.initial_load_path")) if rules is not None else {}
        )
    except (ValueError, HFFolderError):
        return {}


def check_quantization(config: dict, path: str, key: str) -> None:
    """FP8 folders: only DeepSeek's 128 x 128 block-wise e4m3 format is read."""
    quant = config.get("quantization_config")
    if not quant:
        return
    method, block = quant.get("quant_method"), quant.get("weight_block_size", [128, 128])
    if method != "fp8" or list(block) != [128, 128]:
        raise HFFolderError(
            f"{key}: '{path}' is quantized ({method!r}, weight_block_size {block}); only fp8 with"
            " 128 x 128 blocks is read: give an unquantized or block-wise FP8 checkpoint"
        )


def check_folder(
    path: str, model_name: str, flavor: str, args, key: str = "--checkpoint.initial_load_path"
) -> None:
    """config.json and every tensor shape against `args` (the flavor with its vocabulary)."""
    from torchtitan.models.hf.converters import hf_converter

    try:
        converter = hf_converter(model_name)
    except ValueError as e:
        raise HFFolderError(f"{key}: '{path}' is a Hugging Face folder, but {e}") from None
    config = read_config(path, key)
    mismatches = converter.config_mismatches(config, args)
    unexpressible = [m for m in mismatches if "cannot express" in m]
    if unexpressible:  # the shapes may fit, but loading would silently compute another model
        raise HFFolderError(
            f"{key}: '{path}' cannot be loaded faithfully: "
            + ", ".join(unexpressible)
            + f"; {model_name} would compute another attention than the folder's model, so it is"
            " refused (use a checkpoint whose mscale equals mscale_all_dim)"
        )
    if mismatches:
        raise HFFolderError(
            f"{key}: '{path}' holds another model than {model_name} {flavor}: "
            + ", ".join(mismatches)
            + "; pick the --model.flavor (and tokenizer) it was trained with"
        )
    check_quantization(config, path, key)
    wmap = weight_map(path, key)
    sources = resolve_names(converter, args, wmap, path, key)
    used = set(sources.values())
    scales = {n for n in wmap if n.endswith("_scale_inv") and n[: -len("_scale_inv")] in used}
    left_out = _left_out(converter, args, config)
    unused = sorted(n for n in set(wmap) - used - scales if not left_out(n))
    if unused:
        raise HFFolderError(
            f"{key}: '{path}' holds {len(unused)} tensor(s) {model_name} {flavor} has no place for,"
            f" e.g. '{unused[0]}'; it is another architecture or flavor"
        )
    shapes = tensor_shapes(wmap, used | scales, key)
    for name, expected in required_shapes(converter, args, wmap).items():
        got = shapes[sources[name]]
        if got != tuple(expected):
            raise HFFolderError(
                f"{key}: tensor '{sources[name]}' in '{path}' has shape {list(got)}, {model_name}"
                f" {flavor} needs {list(expected)}; pick the flavor (and tokenizer) it was trained with"
            )
    for scale in sorted(scales):
        weight = shapes[scale[: -len("_scale_inv")]]
        tiles = tuple(-(-n // 128) for n in weight)
        if shapes[scale] != tiles:
            raise HFFolderError(
                f"{key}: '{scale}' in '{path}' has shape {list(shapes[scale])}, but block-wise FP8"
                f" scales of a {list(weight)} weight are {list(tiles)} (128 x 128 tiles)"
            )
