"""Every model's args keep the declared contract (models/protocol.ModelArgs): each member, of its
declared type, in every flavor of every registered model and of the user-model example
(tests/integration/user_model/tinylm); and outside torchtitan/models/ nothing probes model args
by name (getattr / hasattr), so the contract is all the framework reads."""

import ast
import dataclasses
import importlib.util
import os
import re
import typing

import pytest
from config_helpers import config_error

from torchtitan.models.protocol import (
    AUX_LOSS_KINDS,
    CONTRACT_MEMBERS,
    MOE_OVERRIDES,
    REPLACED_FIELDS,
    AttentionShape,
    ModelArgs,
    MoeShape,
    contract_gaps,
)
from torchtitan.models.registry import MODELS, ModelEntry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINYLM_ARGS = os.path.join(ROOT, "tests", "integration", "user_model", "tinylm", "args.py")


def _tinylm_flavors() -> dict:
    """tinylm's FLAVORS, read from its file without importing the package (which registers it)."""
    spec = importlib.util.spec_from_file_location("_tinylm_args", TINYLM_ARGS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FLAVORS


FLAVORS = [(name, f, a) for name, e in MODELS.items() for f, a in e.flavors.items()]
FLAVORS += [("tinylm", f, a) for f, a in _tinylm_flavors().items()]


def _of_type(value, hint) -> bool:
    """isinstance against an annotation (a type or a union with None); an int passes for a float,
    a bool for nothing but a bool."""
    allowed = tuple(type(None) if a is None else a for a in (typing.get_args(hint) or (hint,)))
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed + ((int,) if float in allowed else ()))


def _check_record(record, cls) -> None:
    for field, hint in typing.get_type_hints(cls).items():
        value = getattr(record, field)
        assert _of_type(value, hint), f"{cls.__name__}.{field}={value!r} is not {hint}"


@pytest.mark.parametrize("name, flavor, args", FLAVORS, ids=[f"{n}-{f}" for n, f, _ in FLAVORS])
def test_args_keep_the_contract(name, flavor, args):
    assert dataclasses.is_dataclass(args) and type(args).__dataclass_params__.frozen
    assert isinstance(args, ModelArgs) and contract_gaps(args) == []
    hints = {
        m: typing.get_type_hints(getattr(ModelArgs, m).fget)["return"] for m in CONTRACT_MEMBERS
    }
    for member, hint in hints.items():
        value = getattr(args, member)
        assert _of_type(value, hint), f"{name} {flavor}: {member}={value!r} is not {hint}"
    fields = {f.name for f in dataclasses.fields(args)}
    assert set(REPLACED_FIELDS) <= fields
    assert 0 <= args.n_dense_layers <= args.n_layers
    if args.n_dense_layers:  # the planner replaces it with n_layers
        assert "n_dense_layers" in fields
    if args.mtp_depth is not None:  # --model.mtp_depth replaces it
        assert "mtp_depth" in fields and args.mtp_depth >= 0
    att = args.attention
    if att is not None:
        _check_record(att, AttentionShape)
        assert min(att.n_heads, att.n_kv_heads, att.qk_head_dim, att.v_head_dim, att.kv_width) > 0
        assert att.n_heads % att.n_kv_heads == 0


@pytest.mark.parametrize("name, flavor, args", FLAVORS, ids=[f"{n}-{f}" for n, f, _ in FLAVORS])
def test_moe_shape_reflects_the_fields_the_moe_keys_replace(name, flavor, args):
    moe = args.moe
    if moe is None:
        return
    _check_record(moe, MoeShape)
    assert 1 <= moe.n_activated_experts <= moe.n_routed_experts and moe.moe_inter_dim > 0
    assert moe.n_routed_experts % moe.n_expert_groups == 0
    assert 1 <= moe.n_limited_groups <= moe.n_expert_groups
    assert moe.aux_loss_kind in AUX_LOSS_KINDS and moe.n_shared_experts >= 0
    assert set(MOE_OVERRIDES.values()) <= {f.name for f in dataclasses.fields(args)}
    other = {"n_activated_experts": 1, "score_func": "x", "load_balance_coeff": 0.5}
    changed = dataclasses.replace(args, **other, aux_loss_coeff=0.25).moe
    assert (changed.n_activated_experts, changed.score_func) == (1, "x")
    assert (changed.load_balance_coeff, changed.aux_loss_coeff) == (0.5, 0.25)


@dataclasses.dataclass(frozen=True)
class _Forgetful:  # a new model's args without the contract's shapes
    dim: int = 8
    n_layers: int = 2
    vocab_size: int = 0
    max_seq_len: int = 64


def test_args_without_the_contract_are_refused_in_one_line(monkeypatch):
    assert contract_gaps(_Forgetful()) == ["n_dense_layers", "attention", "moe", "mtp_depth"]
    monkeypatch.setitem(MODELS, "forgetful", ModelEntry({"tiny": _Forgetful()}, "nowhere"))
    assert config_error(["--model.name=forgetful", "--model.flavor=tiny"]) == (
        "--model.name=forgetful: its args (_Forgetful) lack n_dense_layers, attention, moe, mtp_depth"
        " of torchtitan.models.protocol.ModelArgs; give them (docs/adding_a_model.md)"
    )


# The model args, by the name of the value (`args`, `run_args`, `self.meta.args`, ...): the rule
# of scripts/house_counts.py. distributed/compile.py's `args` are Dynamo's callback arguments.
ARGS_NAME = re.compile(r"(^|\.)(\w+_)?args$")
NOT_MODEL_ARGS = {os.path.join("torchtitan", "distributed", "compile.py")}


def _probes(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
        in ("getattr", "hasattr")
        and node.args
        and ARGS_NAME.search(ast.unparse(node.args[0]))
    ]


def test_no_model_args_probes_outside_models():
    """Outside torchtitan/models/ model args are read through the contract, never probed."""
    found = []
    for folder, dirs, files in os.walk(os.path.join(ROOT, "torchtitan")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in (f for f in files if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(folder, f), ROOT)
            if (
                rel.startswith(os.path.join("torchtitan", "models") + os.sep)
                or rel in NOT_MODEL_ARGS
            ):
                continue
            with open(os.path.join(ROOT, rel)) as src:
                tree = ast.parse(src.read(), rel)
            found += [f"{rel}:{c.lineno} {ast.unparse(c)}" for c in _probes(tree)]
    assert found == [], "read models.protocol.ModelArgs instead:\n" + "\n".join(found)
