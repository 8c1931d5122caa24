"""What torch.compile guards on must be shared across blocks, or every block recompiles
(and past torch's recompile limit of 8, the remaining blocks silently run eager): the AC
region's context function and SimpleFSDP's module subclass."""

from torch import nn

from torchtitan.distributed.activation_checkpoint import RegionSpec, wrap_region
from torchtitan.distributed.simple_fsdp import _unflatten_shapes, _unit_class


def _context_fn(wrapper):
    return wrapper.checkpoint_fn.keywords["context_fn"]


def test_equal_regions_share_one_context_function():
    groups = frozenset({"3"})
    a = wrap_region(nn.Linear(2, 2), RegionSpec("op", "save"), groups)
    b = wrap_region(nn.Linear(2, 2), RegionSpec("op", "save"), groups)  # an equal, distinct spec
    c = wrap_region(nn.Linear(2, 2), RegionSpec("op", "recompute"), groups)
    assert _context_fn(a) is _context_fn(b)
    assert _context_fn(a) is not _context_fn(c)


def test_simple_fsdp_subclass_is_one_per_module_class():
    assert _unit_class(nn.Linear) is _unit_class(nn.Linear)
    assert _unit_class(nn.Linear) is not _unit_class(nn.Embedding)
    assert (
        issubclass(_unit_class(nn.Linear), nn.Linear)
        and _unit_class(nn.Linear).__name__ == "SimpleFSDPLinear"
    )


def test_gathered_shapes_round_trip_through_the_op_arguments():
    assert _unflatten_shapes([2, 4, 3, 1, 7, 3, 2, 2, 2]) == [[4, 3], [7], [2, 2, 2]]
    assert _unflatten_shapes([]) == []
