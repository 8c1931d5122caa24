"""`job.custom_config_module`: a user's module extends the config with sections and keys.

The module defines a `JobConfig` dataclass (upstream's extension point, same shape): each of
its fields is a section; a section this config has already gains the module's keys (and takes
the module's defaults for keys both define), a new one is added as it is. The result is a
subclass of our JobConfig, so every part of the run reads it as before. Torch-free.
"""

import dataclasses
import importlib
import typing
from dataclasses import field

from torchtitan.config.upstream import BUILT_IN_EXTENSIONS

# The extension's merged classes have no source file of their own; this module name makes
# inspect.getsource fail cleanly instead of finding a same-named class somewhere else.
_MERGED_MODULE = "torchtitan.config.extensions.merged"


class ExtensionError(ValueError):
    """The module cannot extend the config; the message is one line naming the key."""


def _is_section(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _merge(ours: type, theirs: type) -> type:
    """A dataclass with ours' and theirs' fields (theirs win), nested sections merged too."""
    our_types, their_types = typing.get_type_hints(ours), typing.get_type_hints(theirs)
    nested = []
    for f in dataclasses.fields(theirs):
        tp = their_types[f.name]
        if f.name in our_types and _is_section(our_types[f.name]) and _is_section(tp):
            sub = _merge(our_types[f.name], tp)
            nested.append((f.name, sub, field(default_factory=sub)))
    merged = dataclasses.make_dataclass(ours.__name__, nested, bases=(theirs, ours))
    merged.__module__ = _MERGED_MODULE
    merged.__doc__ = theirs.__doc__ if ours.__doc__ is None else ours.__doc__
    return merged


def extended(base: type, module_name: str) -> type:
    """`base` (our JobConfig) extended by `module_name`'s JobConfig; `base` itself for the
    upstream modules whose keys are ours already. Raises ExtensionError."""
    if not module_name or module_name in BUILT_IN_EXTENSIONS:
        return base
    key = "--job.custom_config_module"
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # an import error of any kind is the user's module's
        raise ExtensionError(
            f"{key}: cannot import '{module_name}' ({type(e).__name__}: {e}); put it on"
            " PYTHONPATH or name an installed module"
        ) from None
    theirs = getattr(module, "JobConfig", None)
    if not _is_section(theirs):
        raise ExtensionError(
            f"{key}: module '{module_name}' has no JobConfig dataclass; define one whose fields"
            " are the sections to add"
        )
    hints = typing.get_type_hints(theirs)
    plain = [f.name for f in dataclasses.fields(theirs) if not _is_section(hints[f.name])]
    if plain:
        raise ExtensionError(
            f"{key}: {module_name}.JobConfig.{plain[0]} is not a section; every field of an"
            " extension's JobConfig must be a dataclass (a [section])"
        )
    return _merge(base, theirs)
