"""TOML + command-line overrides -> a validated JobConfig.

Precedence: CLI > TOML > dataclass defaults. Every problem is reported as one
`ConfigError` line that names the key, the bad value and how to fix it. Nothing here
imports torch or touches the file system beyond reading, so a bad config fails fast and
before any process group exists.
"""

import ast
import dataclasses
import difflib
import inspect
import json
import math
import textwrap
import tomllib
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from torchtitan.config.extensions import ExtensionError, extended
from torchtitan.config.job_config import JobConfig
from torchtitan.config.upstream import UPSTREAM_SPELLINGS, apply_upstream_values, spelling_lines


class ConfigError(ValueError):
    """A bad configuration value; its message is one line meant for the user."""


def suggest(word: str, choices) -> str:
    """ " (did you mean 'x'?)" for the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# The JobConfig class of this process: ours, or ours extended by job.custom_config_module
# (config/extensions.py); set by build_config before it reads any key.
_ROOT: list[type] = [JobConfig]


def _nested(cls: type) -> dict[str, type]:
    """The fields of a dataclass that are sections themselves (e.g. training.dataloader)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if _is_section(hints[f.name])}


def _is_section(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def sections() -> dict[str, type]:
    """Every section by its dotted TOML name, nested ones after their parent ("training",
    "training.dataloader", "quantize.linear.float8"); a section holding only sections (e.g.
    "quantize") is not listed, it has no keys of its own."""
    out: dict[str, type] = {}

    def walk(prefix: str, cls: type) -> None:
        for name, sub in _nested(cls).items():
            path = f"{prefix}{name}"
            if field_types(sub):
                out[path] = sub
            walk(path + ".", sub)

    walk("", _ROOT[0])
    return out


def section_of(cfg: JobConfig, section: str) -> Any:
    """The section object of `cfg` at a dotted name (cfg.training.dataloader)."""
    obj: Any = cfg
    for part in section.split("."):
        obj = getattr(obj, part)
    return obj


def field_types(section_cls: type) -> dict[str, Any]:
    """A section's keys and their types (nested sections left out: they are sections)."""
    hints = typing.get_type_hints(section_cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(section_cls)
        if not _is_section(hints[f.name])
    }


def field_docs(section_cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass (attribute docstrings)."""
    docs: dict[str, str] = {}
    for cls in reversed(section_cls.__mro__):
        if cls is not object and dataclasses.is_dataclass(cls):
            docs.update(_class_docs(cls))
    return docs


def _class_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # made at run time (config/extensions.py): no source
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _is_union(tp) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def type_name(tp) -> str:
    """A field's type as --help and docs/config.md show it: int, float|auto, auto|sigmoid|softmax."""
    if _is_union(tp):
        return "|".join(type_name(a) for a in get_args(tp))
    if get_origin(tp) is Literal:
        return "|".join(str(a) if a != "" else '""' for a in get_args(tp))
    if get_origin(tp) is list:
        return f"list[{type_name(get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


def convert(key: str, tp, value: Any) -> Any:
    """Convert a TOML or CLI value to the field's type; raise ConfigError naming the key."""
    origin = get_origin(tp)
    if _is_union(tp):  # a number or a word ("auto", "none"): the word first
        words = [w for a in get_args(tp) if get_origin(a) is Literal for w in get_args(a)]
        if isinstance(value, str) and value.strip() in words:
            return value.strip()
        number = next(a for a in get_args(tp) if a in (int, float))
        try:
            return convert(key, number, value)
        except (
            ConfigError
        ) as e:  # "expected a number, got 'x'" -> "expected 'auto' or a number, got 'x'"
            shown = " or ".join(repr(w) for w in words)
            raise ConfigError(str(e).replace(": expected ", f": expected {shown} or ", 1)) from None
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise ConfigError(
                f"--{key}: invalid value {value!r}; choose one of {shown}"
                f"{suggest(str(value), [str(c) for c in choices])}"
            )
        return value
    if origin is list:
        (item_tp,) = get_args(tp)
        if isinstance(value, str) and value.strip().startswith("["):  # JSON, e.g. [["a"], ["b"]]
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--{key}: {value!r} is not a JSON list: {e}") from None
        elif isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"--{key}: expected a list ({type_name(tp)}), got {value!r}")
        return [convert(key, item_tp, v) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"--{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        text = str(value).strip()
        try:
            return int(text, 16) if text.lower().startswith(("0x", "-0x")) else int(text)
        except ValueError:
            raise ConfigError(f"--{key}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"--{key}: expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(value, (int, float)) else float(str(value))
        except ValueError:
            raise ConfigError(f"--{key}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"--{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"--{key}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"--{key}: unsupported type {tp}")  # pragma: no cover


def _lookup(section: str, key: str) -> tuple[type, Any]:
    secs = sections()
    if section not in secs:
        top = section.split(".")[0]
        tops = list(dict.fromkeys(s.split(".")[0] for s in secs))
        if top not in tops:
            raise ConfigError(
                f"unknown config section '{top}' in '{section}.{key}'{suggest(top, tops)};"
                f" sections: {', '.join(tops)}"
            )
        hint = suggest(section, secs)
        raise ConfigError(f"unknown config key '{section}.{key}'{hint}; see --help for all keys")
    types = field_types(secs[section])
    if key not in types:
        # A key that exists under another section was most likely put in the wrong one.
        elsewhere = [f"{s}.{key}" for s, c in secs.items() if key in field_types(c)]
        all_keys = [f"{s}.{k}" for s, c in secs.items() for k in field_types(c)]
        hint = (
            f" (did you mean '{elsewhere[0]}'?)"
            if elsewhere
            else suggest(f"{section}.{key}", all_keys)
        )
        raise ConfigError(f"unknown config key '{section}.{key}'{hint}; see --help for all keys")
    return secs[section], types[key]


# Keys we accept under an older name, with one warning line each: (section, old key) ->
# (new key, or "section.key" when it moved to another section; value map or None; warning).
_TO_PLANNING = "moved to [planning] with the other pre-launch planning keys"
DEPRECATED_KEYS: dict[tuple[str, str], tuple[str, dict | None, str]] = {
    **{
        (section, key): (f"planning.{key}", None, f"use 'planning.{key}' ({_TO_PLANNING})")
        for section, key in (
            ("job", "fit"),
            ("job", "layout_candidates"),
            ("job", "layout_seconds"),
            ("job", "nearby"),
            ("job", "allow_over_budget"),
            ("parallelism", "memory_budget_gib"),
            ("moe", "memory_skew"),
        )
    },
    ("training", "dataloader_workers"): (
        "training.dataloader.num_workers",
        None,
        "use 'training.dataloader.num_workers' (upstream's [training.dataloader] table)",
    ),
    ("experimental", "custom_args_module"): (
        "job.custom_config_module",
        None,
        "use 'job.custom_config_module' (upstream moved it there)",
    ),
    ("metrics", "peak_tflops"): (
        "hardware.peak_tflops",
        None,
        "use 'hardware.peak_tflops' (one figure for the predicted and the measured MFU)",
    ),
    ("parallelism", "reshard_budget_gib"): (
        "planning.memory_budget_gib",
        None,
        "replaced by 'planning.memory_budget_gib', the whole predicted peak per rank (it counted only"
        " unsharded parameters); its value is taken as the memory budget",
    ),
}


# Values of earlier releases that mean what "auto" / "none" mean now: (section, key) -> {old
# value: (new value, deprecation note or None)}. None: accepted silently (the anchors' own
# spelling, e.g. torchtitan's data_parallel_shard_degree = -1); a note: accepted with one
# deprecation line.
LEGACY_VALUES: dict[tuple[str, str], dict[Any, tuple[str, str | None]]] = {
    ("training", "global_batch_size"): {-1: ("auto", None)},
    ("parallelism", "data_parallel_shard_degree"): {-1: ("auto", None)},
    ("checkpoint", "load_step"): {-1: ("auto", None)},
    ("parallelism", "pipeline_parallel_layers_per_stage"): {-1: ("auto", "an even split")},
    ("planning", "memory_budget_gib"): {
        0: ("auto", "the device's memory"),
        -1: ("none", "no budget"),
    },
    ("moe", "top_k"): {0: ("auto", "the flavor's value")},
    ("moe", "score_func"): {"flavor": ("auto", "the flavor's choice")},
    ("moe", "load_balance_coeff"): {-1: ("auto", "the flavor's value")},
    ("moe", "aux_loss_coeff"): {-1: ("auto", "the flavor's value")},
    ("comm", "hang_timeout_seconds"): {-1: ("auto", "60% of timeout_seconds")},
    ("hardware", "peak_tflops"): {0: ("auto", "the GPU's datasheet figure")},
}


def _same(value: Any, old: Any) -> bool:
    """A TOML or CLI value equals a legacy one (the CLI gives strings: "-1" is -1)."""
    if isinstance(old, str):
        return isinstance(value, str) and value.strip() == old
    if isinstance(value, bool):
        return False
    try:
        return float(value) == old
    except (TypeError, ValueError):
        return False


def _legacy(section: str, key: str, value: Any, warnings: list[str]) -> Any:
    for old, (new, note) in LEGACY_VALUES.get((section, key), {}).items():
        if _same(value, old):
            if note is not None:
                shown = f'"{old}"' if isinstance(old, str) else old
                warnings.append(
                    f"'{section}.{key} = {shown}' is deprecated: write {new!r} ({note})"
                )
            return new
    return value


def _set(cfg: JobConfig, dotted: str, value: Any, origin: str, warnings: list[str]) -> None:
    if "." not in dotted:
        raise ConfigError(f"config key '{dotted}' ({origin}) must look like section.key")
    section, key = dotted.rsplit(".", 1)
    if (section, key) in DEPRECATED_KEYS:
        new_key, mapping, note = DEPRECATED_KEYS[(section, key)]
        if mapping is not None and isinstance(value, str):
            value = mapping.get(value, value)
        warnings.append(f"'{section}.{key}' is deprecated: {note}")
        section, key = new_key.rsplit(".", 1) if "." in new_key else (section, new_key)
    if (section, key) in UPSTREAM_SPELLINGS:
        spelling = UPSTREAM_SPELLINGS[(section, key)]
        section, key = spelling.target.rsplit(".", 1)
        if spelling.to_ours is not None:
            typed = (
                value
                if spelling.upstream_type is None
                else convert(dotted, spelling.upstream_type, value)
            )
            value = spelling.to_ours(typed)
    _, tp = _lookup(section, key)
    value = _legacy(section, key, value, warnings)
    setattr(section_of(cfg, section), key, convert(f"{section}.{key}", tp, value))


def _flatten(prefix: str, table: dict, origin: str) -> list[tuple[str, Any]]:
    """A TOML table -> (dotted key, value) pairs; nested tables that are sections
    ([quantize.linear.float8], [training.dataloader]) become longer dotted keys. A table
    where a key belongs stays a value (and is then reported as the wrong type)."""
    pairs, secs = [], sections()
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and (
            path in secs or any(s.startswith(path + ".") for s in secs)
        ):
            pairs.extend(_flatten(f"{path}.", value, origin))
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


def parse_cli(argv: list[str]) -> tuple[list[tuple[str, str]], bool]:
    """`--a.b=c`, `--a.b c`, and a bare `--a.b` for true -> [(key, value)], help flag."""
    pairs, want_help, i = [], False, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            want_help = True
            i += 1
            continue
        if not arg.startswith("--"):
            raise ConfigError(
                f"unexpected argument '{arg}': overrides look like --section.key=value"
            )
        body = arg[2:]
        if "=" in body:
            key, value = body.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and argv[i + 1] != "-h":
            key, value = body, argv[i + 1]
            i += 2
        else:
            key, value = body, "true"
            i += 1
        pairs.append((key, value))
    return pairs, want_help


def section_docs(cls: type) -> str:
    """The docstring of a section's dataclass ("" when it has none)."""
    return (
        " ".join((cls.__doc__ or "").split())
        if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(")
        else ""
    )


def help_text() -> str:
    lines = ["usage: run_train.sh [--section.key=value ...]   (CLI > TOML > defaults)", ""]
    for name, cls in sections().items():
        lines.append(f"[{name}]")
        docs, types = field_docs(cls), field_types(cls)
        defaults = cls()
        for key, tp in types.items():
            lines.append(f"  --{name}.{key} ({type_name(tp)}, default {getattr(defaults, key)!r})")
            lines.append(f"      {docs.get(key, '')}")
        lines.append("")
    lines.append(
        "[upstream spellings] (upstream torchtitan's names for keys above, accepted as they are)"
    )
    lines.extend(f"  {line}" for line in spelling_lines())
    return "\n".join(lines)


def load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--job.config_file: file '{path}' not found") from None
    except IsADirectoryError:
        raise ConfigError(f"--job.config_file: '{path}' is a folder, not a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--job.config_file: '{path}' is not valid TOML: {e}") from None


def _extension_module(pairs: list[tuple[str, str]], data: dict) -> str:
    """job.custom_config_module (or upstream's older experimental.custom_args_module) from the
    command line, else from the TOML: it decides which keys exist, so it is read first."""
    names = ("job.custom_config_module", "experimental.custom_args_module")
    cli = [v for k, v in pairs if k in names]
    if cli:
        return cli[-1]
    job, experimental = data.get("job", {}), data.get("experimental", {})
    if isinstance(job, dict) and job.get("custom_config_module"):
        return str(job["custom_config_module"])
    if isinstance(experimental, dict) and experimental.get("custom_args_module"):
        return str(experimental["custom_args_module"])
    return ""


def build_config(argv: list[str]) -> tuple[JobConfig, list[str]]:
    """argv (without the program name) -> (JobConfig, deprecation warnings). Raises ConfigError."""
    pairs, want_help = parse_cli(argv)
    # The last --job.config_file wins, like every other key (run_train.sh passes its default first).
    config_file = next((v for k, v in reversed(pairs) if k == "job.config_file"), "")
    data = load_toml(config_file) if config_file else {}
    try:
        _ROOT[0] = extended(JobConfig, _extension_module(pairs, data))
    except ExtensionError as e:
        raise ConfigError(str(e)) from None
    if want_help:
        print(help_text())
        raise SystemExit(0)
    cfg, warnings = _ROOT[0](), []
    if config_file:
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(
                    f"{config_file}: top-level key '{section}' must be a [section] table"
                )
            for key, value in _flatten(f"{section}.", table, config_file):
                _set(cfg, key, value, config_file, warnings)
    for key, value in pairs:
        _set(cfg, key, value, "command line", warnings)
    apply_upstream_values(cfg, warnings)
    return cfg, warnings
