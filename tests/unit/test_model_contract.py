"""Every registered model keeps the written contract (models/protocol.py) the shared build path
reads, and is registered once (registry.py) for flavors, train spec and converter alike."""

import dataclasses

import pytest
import torch
from torch import nn

from torchtitan.distributed.plan import BLOCKS, FsdpUnit, UnitKind
from torchtitan.models.flavors import flavors_of
from torchtitan.models.hf.converters import hf_converter
from torchtitan.models.protocol import TrainableModel
from torchtitan.models.registry import MODELS
from torchtitan.models.train_spec import get_train_spec


@pytest.mark.parametrize("name", list(MODELS))
def test_registered_once_for_flavors_spec_and_converter(name):
    entry = MODELS[name]
    spec = get_train_spec(name)
    assert spec.name == name and spec.flavors is entry.flavors is flavors_of(name)
    if entry.hf_converter:
        assert hf_converter(name).__name__ == entry.hf_converter
    else:
        with pytest.raises(ValueError, match=f"model {name} has no Hugging Face weight converter"):
            hf_converter(name)


def _optional_features(args) -> dict:
    """Every optional module on (DeepSeek-V3's multi-token prediction)."""
    return {"mtp_depth": 1} if args.mtp_depth is not None else {}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_keeps_the_contract(name):
    spec = get_train_spec(name)
    tiny = spec.flavors["tiny"]
    args = dataclasses.replace(tiny, vocab_size=256, max_seq_len=32, **_optional_features(tiny))
    with torch.device("meta"):
        model = spec.model_cls(args)
        without = spec.model_cls(dataclasses.replace(tiny, vocab_size=256, max_seq_len=32))
    assert isinstance(model, TrainableModel)
    blocks = getattr(model, BLOCKS)
    assert isinstance(blocks, nn.ModuleDict) and list(blocks) == [
        str(i) for i in range(args.n_layers)
    ]
    for attr in (*model.first_stage_modules, *model.last_stage_modules):
        assert isinstance(getattr(model, attr), nn.Module), attr
        # built without its optional features, a stage module is a module or None (left out)
        assert getattr(without, attr) is None or isinstance(getattr(without, attr), nn.Module), attr
    units = model.fsdp_units()
    assert all(isinstance(u, FsdpUnit) and u.decision is None and u.param_bytes == 0 for u in units)
    for u in units:  # every unit is a real submodule, inside its block when it has one
        model.get_submodule(u.name)
        assert u.block is None or u.name == u.block or u.name.startswith(u.block + "."), u
        assert not u.is_root  # the framework adds the root
    assert [u.name for u in units if u.name.startswith(BLOCKS + ".") and u.name == u.block] == [
        f"{BLOCKS}.{i}" for i in range(args.n_layers)
    ]  # blocks in forward order
    experts = [u for u in units if u.kind is UnitKind.EXPERTS]
    assert all(u.block is not None for u in experts)
    assert model.flops_per_token(32) > 0
