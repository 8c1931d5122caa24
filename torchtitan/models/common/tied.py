"""Tied weights: one parameter that two modules use (Qwen3's output head is its embedding).

A model that ties names them in `tied_weights` ({copy name: parameter name}, e.g.
{"output.weight": "tok_embeddings.weight"}). Steps that give a module a new parameter object
(TP's distribute, `to_empty`) untie them; `retie` makes the copy the parameter again where a
part holds both. A pipeline stage that holds only the copy keeps it as its own parameter
(named as the copy), which distributed/tied_copies.py keeps equal to the parameter.
"""

from torch import nn


def _owner(model: nn.Module, name: str) -> tuple[nn.Module | None, str]:
    path, _, attr = name.rpartition(".")
    try:
        return (model.get_submodule(path) if path else model), attr
    except AttributeError:  # a pipeline stage set the module to None
        return None, attr


def retie(model: nn.Module) -> None:
    """Point every tied copy of `model` at its parameter, where the part holds both."""
    for copy, source in getattr(model, "tied_weights", {}).items():
        (c_mod, c_attr), (s_mod, s_attr) = _owner(model, copy), _owner(model, source)
        if c_mod is not None and s_mod is not None:
            c_mod._parameters[c_attr] = s_mod._parameters[s_attr]
