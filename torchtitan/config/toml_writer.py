"""A job config as TOML text that --job.config_file reads back to the same config
(job.save_config_file). The standard library reads TOML but writes none; the config holds only
bools, ints, floats, strings, lists of them and nested sections, which is all this writes.
Torch-free, imports nothing of ours.
"""

import dataclasses
import json
import math


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back to the same float
    if isinstance(value, str):
        # JSON's escapes are TOML's basic-string escapes; TOML also wants DEL escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _section(name: str, obj, out: list[str]) -> None:
    """[name] with obj's keys, then its nested sections as [name.child]; a key whose value is
    None (no TOML spelling) is left out, so it reads back as its default."""
    keys, nested = [], []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            nested.append((f"{name}.{f.name}", value))
        elif value is not None:
            keys.append(f"{f.name} = {_value(value)}")
    out.append(f"[{name}]")
    out.extend(keys)
    out.append("")
    for child, value in nested:
        _section(child, value, out)


def config_toml(cfg) -> str:
    """Every section and key of `cfg` (a JobConfig dataclass), in declaration order."""
    out: list[str] = []
    for f in dataclasses.fields(cfg):
        _section(f.name, getattr(cfg, f.name), out)
    return "\n".join(out)
