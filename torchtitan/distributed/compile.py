"""torch.compile per transformer block: one graph per block kind, `fullgraph=True`, reused by
every block of that kind (docs/compile.md).

`apply_compile` compiles each block of a ModuleDict with `fullgraph=True`: a graph break
would be an error, not a silent eager island. What makes every block of Llama3, DeepSeek-V3
and Qwen3 (dense, MoE, MTP) trace as one graph on torch 2.13:

- grouped GEMM is the opaque operator `torchtitan::grouped_mm` (models/common/grouped_mm.py)
  with its own fake implementation and backward: aten's meta kernel refuses float32;
- expert parallel's split sizes (`.tolist()` of the exchanged counts) trace as unbacked
  sizes: a new routing reuses the graph;
- `torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True`: a MoE layer
  writes its token counter (`tokens_per_expert`) and balance loss (`aux_loss`) to the module
  in forward. Inside an activation-checkpoint region dynamo refuses such a write ("HOP:
  Unsafe side effect": eager checkpointing would replay it in the recompute) unless this flag
  lets the compiled forward apply it once and the recompute skip it. The eager layer skips
  it in the recompute too (it checks whether autograd's engine is running), so eager and
  compiled count the same tokens.
- torch 2.13's partitioner puts the random-state outputs of recomputed random ops (CPU SDPA
  is tagged `nondeterministic_seeded`) after the saved opaque objects (a DeviceMesh, which a
  DTensor's `to_local` keeps for its backward), where the runtime expects tensors: compiling a
  fully recomputed block that holds DTensor parameters (expert or tensor parallel) fails in
  `save_from_forward` with "expected all tensors_saved_with_vc_check to be Tensors".
  `_fix_rng_state_order` moves those states among the saved tensors, in forward and backward
  alike (`_patch_partitioner`).
- inputs still in flight (tensor parallel's AsyncCollectiveTensor) are waited on before the
  graph (`_settled`): as a graph input their gradient came back wrong.

Not one graph yet: a block holding an FSDP2 / DDP unit (a MoE block's experts under the FSDP2
machinery; SimpleFSDP's today too): see `apply_compile`'s `hooked`.

`configure_compile_passes` (before the blocks compile): compile.graph_passes and async TP.
SimpleFSDP's gathers are one opaque op per FSDP unit (simple_fsdp.GATHER_OP) and each block is
its own graph, so inductor's FX bucketing (`bucket_all_gathers_fx`) finds no all-gather to
merge (torch 2.13, measured: the forward graph holds only the opaque op, the backward one
reduce-scatter per unit): transformer_block_bucketing is the layout SimpleFSDP runs anyway,
auto_bucketing is refused before launch (checks/compile_keys.py). Async TP sets inductor's
micro-pipeline TP pass and symmetric memory on the TP group (CUDA only).

Compile statistics (`compile_stats`, `compile_log_lines`): dynamo's counters (graphs, graph
breaks) and, per compile, the block whose call triggered it and its seconds (forward, and the
backward when compiled lazily); with TORCHTITAN_COMPILE_STATS=<prefix> set, every rank writes
them to `<prefix>rank<r>.json` after every compile.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from functools import partial, wraps

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn

from torchtitan.config.job_config import Compile, Parallelism

STATS_ENV = "TORCHTITAN_COMPILE_STATS"
logger = logging.getLogger(__name__)


def configure_dynamo() -> None:
    """The dynamo settings compiled blocks rely on (module docstring); idempotent."""
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    _patch_partitioner()
    _STATS.install()


def configure_compile_passes(compile_cfg: Compile, parallelism: Parallelism, tp_mesh) -> None:
    """Before the blocks compile (the checks refused every combination not handled here):
    - compile.graph_passes=transformer_block_bucketing: SimpleFSDP already gathers and
      reduces each block's unit as one bucket; nothing to set (module docstring);
    - enable_async_tensor_parallel: inductor's micro-pipeline TP pass, which decomposes TP's
      all-gather + matmul (matmul + reduce-scatter) into overlapped chunks over symmetric
      memory, enabled on the TP group (`tp_mesh`, None without TP)."""
    if compile_cfg.graph_passes == "transformer_block_bucketing":
        logger.info(
            "compile: transformer_block_bucketing: SimpleFSDP gathers and reduce-scatters"
            " each block's FSDP unit as one bucket already"
        )
    if parallelism.enable_async_tensor_parallel and tp_mesh is not None:
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        inductor_config._micro_pipeline_tp = True
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)
        logger.info("compile: async TP (micro-pipeline TP over symmetric memory) on the TP group")


def apply_compile(
    layers: nn.ModuleDict,
    compile_cfg: Compile,
    name: str = "layers",
    hooked: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Compile each block of `layers` (the model's ModuleDict called `name`) with
    fullgraph=True. Blocks of one kind share one graph (their guards match).

    `hooked`: blocks ("layers.3") holding a module whose hooks dynamo may not trace: an
    FSDP2 / DDP unit nested in the block (a MoE block's experts), whose hooks torch 2.13
    wraps in `torch._dynamo.disable`. Those blocks compile with fullgraph=False; the caller
    moves their MoE dispatch out of the graph (`MoE.dispatch_in_graph`, set by
    models/common/parallelize.py): one break, at the dispatch (docs/compile.md).

    Each compiled block gets a forward pre-hook (outside its graph) that counts its calls for
    `compile_stats` and waits on inputs whose collective is still in flight (`_settled`)."""
    configure_dynamo()
    for key, block in list(layers.items()):
        full = f"{name}.{key}" not in hooked
        # dynamic=False: a block's shapes are fixed for a run; dynamo's automatic dynamic shapes
        # would otherwise turn a second input layout (MTP's strided first-block input) into
        # symbolic sizes, which DTensor's sharding propagation cannot hash (torch 2.13)
        compiled = torch.compile(block, backend=compile_cfg.backend, fullgraph=full, dynamic=False)
        compiled.register_forward_pre_hook(
            partial(_before_block, f"{name}.{key}"), with_kwargs=True
        )
        if not full:
            _STATS.not_fullgraph.add(f"{name}.{key}")
        layers[key] = compiled


def compile_function(fn, backend: str, name: str):
    """`fn` compiled whole (fullgraph=True), its compiles counted under `name` in
    `compile_stats` (the loss: "loss", not the block that ran last)."""
    configure_dynamo()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)

    @wraps(fn)
    def call(*args, **kwargs):
        _STATS.entering(name)
        return compiled(*args, **kwargs)

    return call


def _settled(x):
    # Tensor parallel's asynchronous collectives (e.g. the embeddings' reduce-scatter) hand the
    # next block an AsyncCollectiveTensor. A compiled block takes it as a tensor-subclass input
    # and returns its gradient as a plain tensor, which the collective's backward (DTensor's
    # redistribute) then mishandles: wrong gradients or an error. Waiting through the op, out
    # here, keeps the autograd graph and hands the graph a plain tensor.
    return funcol.wait_tensor(x) if isinstance(x, funcol.AsyncCollectiveTensor) else x


def _before_block(block: str, module, args, kwargs):
    """Forward pre-hook of a compiled block (runs outside its graph)."""
    _STATS.entering(block)
    return tuple(_settled(a) for a in args), {k: _settled(v) for k, v in kwargs.items()}


# --------------------------------------------------------------------------- statistics


class _CompileStats:
    """Per process: every compile (dynamo's start/end callbacks) with the block being called
    when it started, and how often each block was called by then."""

    def __init__(self):
        self.lock = threading.Lock()
        self.block: str | None = None  # the compiled block whose forward runs now
        self.calls: Counter = Counter()  # block -> forward calls so far
        self.open: dict[
            str, tuple[float, str | None, int]
        ] = {}  # compile id -> (start, block, calls)
        self.events: list[dict] = []
        self.not_fullgraph: set[str] = set()  # blocks compiled with fullgraph=False

    def install(self) -> None:
        # (again after torch._dynamo.reset(), which drops every callback)
        from torch._dynamo.callback import callback_handler

        if self._start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._start)
        if self._end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._end)

    def entering(self, block: str) -> None:
        self.block = block
        self.calls[block] += 1

    def _start(self, args=None) -> None:
        key = _key(args)
        with self.lock:
            self.open[key] = (
                time.perf_counter(),
                self.block,
                self.calls[self.block] if self.block else 0,
            )

    def _end(self, args=None) -> None:
        key = _key(args)
        with self.lock:
            start, block, calls = self.open.pop(key, (time.perf_counter(), self.block, 0))
            trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
            self.events.append(
                {
                    "compile_id": getattr(args, "compile_id", None),
                    "trigger": trigger,
                    "block": block,
                    "block_calls": calls,
                    "seconds": time.perf_counter() - start,
                }
            )
        path = os.environ.get(STATS_ENV)
        if path:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            with open(f"{path}rank{rank}.json", "w") as f:
                json.dump(compile_stats(), f)


def _key(args) -> str:
    return f"{getattr(getattr(args, 'callback_trigger', None), 'name', '')}:{getattr(args, 'compile_id', '')}"


_STATS = _CompileStats()


def compile_stats() -> dict:
    """This process's compile figures so far:
    - `not_fullgraph`: the blocks compiled with fullgraph=False (`apply_compile`'s `hooked`);
    - `graphs`: graphs dynamo captured (`counters["stats"]["unique_graphs"]`), one per block
      kind when nothing recompiles;
    - `graph_breaks`: dynamo's graph-break count (0: fullgraph=True raises on a break), and
      `break_reasons` (dynamo's reason -> count);
    - `compiles`: dynamo compiles (a new graph, or a retrace that found one);
    - `late_compiles`: compiles started by a block that had already run (compiled) before:
      a recompile after the block's first call, e.g. from step 2 on (0 expected);
    - `blocks`: per block whose first call compiled, {"seconds": forward compile plus the
      lazily compiled backward of the same graph, "compiles": n};
    - `events`: every compile (id, trigger DYNAMO / LAZY_BACKWARD, block, seconds)."""
    from torch._dynamo.utils import counters

    with _STATS.lock:
        events = list(_STATS.events)
    dynamo = [e for e in events if e["trigger"] == "DYNAMO"]
    by_id = {e["compile_id"]: e["block"] for e in dynamo}
    blocks: dict[str, dict] = {}
    for e in events:
        block = e["block"] if e["trigger"] == "DYNAMO" else by_id.get(e["compile_id"], e["block"])
        entry = blocks.setdefault(str(block), {"seconds": 0.0, "compiles": 0})
        entry["seconds"] += e["seconds"]
        entry["compiles"] += e["trigger"] == "DYNAMO"
    return {
        "not_fullgraph": sorted(_STATS.not_fullgraph),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "break_reasons": {str(k)[:160]: int(v) for k, v in counters["graph_break"].items()},
        "compiles": len(dynamo),
        "late_compiles": sum(1 for e in dynamo if e["block_calls"] > 1),
        "blocks": blocks,
        "events": events,
    }


def reset_compile_stats() -> None:
    """Forget the compiles seen so far and dynamo's counters (tests; a trainer never needs it)."""
    from torch._dynamo.utils import counters

    with _STATS.lock:
        _STATS.events.clear()
        _STATS.open.clear()
        _STATS.calls.clear()
        _STATS.not_fullgraph.clear()
        _STATS.block = None
    counters.clear()


def compile_log_lines() -> list[str]:
    """One log line for the trainer (e.g. after the first step, once compiling is done):
    graphs, graph breaks, late compiles and the compile seconds of each block that compiled."""
    s = compile_stats()
    if not s["events"] and not s["graphs"]:
        return []
    per_block = ", ".join(f"{b} {v['seconds']:.1f}s" for b, v in s["blocks"].items())
    total = sum(v["seconds"] for v in s["blocks"].values())
    lines = [
        f"[torchtitan] compile: {s['graphs']} graph(s), {s['graph_breaks']} graph break(s),"
        f" {s['late_compiles']} recompile(s) after a block's first call; {total:.1f}s compiling"
        f" ({per_block}; other blocks reused these graphs)"
    ]
    if s["not_fullgraph"]:
        lines.append(
            f"[torchtitan] compile: {len(s['not_fullgraph'])} block(s) hold an FSDP2/DDP unit (MoE experts)"
            " whose hooks dynamo cannot trace: compiled with a graph break at that call"
            " (fsdp_implementation=simple_fsdp compiles them whole)"
        )
    return lines


# --------------------------------------------------------------------------- torch 2.13 partitioner


def _is_rng_state(node) -> bool:
    return (
        node.op == "call_function"
        and node.target is __import__("operator").getitem
        and getattr(node.args[0], "target", None) is torch._prims.rng_prims.run_and_save_rng_state
        and node.args[1] == 0
    )


def _trails_tensors(node) -> bool:
    """A saved forward output the runtime expects after the saved tensors that need a version
    check: an opaque object, or a tensor kept without the check."""
    from torch._functorch._aot_autograd.graph_compile import is_opaque_node

    return is_opaque_node(node) or bool(node.meta.get("saved_tensor_with_no_vc_check", False))


def _fix_rng_state_order(fw_module: torch.fx.GraphModule, bw_module: torch.fx.GraphModule) -> bool:
    """Move the random states the partitioner saved (forward outputs, backward inputs) in
    front of the saved outputs that must follow the checked tensors (opaque objects, tensors
    without version check), in both graphs alike. True when something moved."""
    bw_inputs = list(bw_module.graph.find_nodes(op="placeholder"))
    n_saved = next((i for i, p in enumerate(bw_inputs) if "tangent" in p.name), len(bw_inputs))
    fw_out = next(iter(fw_module.graph.find_nodes(op="output")))
    outs = list(fw_out.args[0])
    saved = outs[len(outs) - n_saved :] if n_saved else []
    states = [n for n in saved if isinstance(n, torch.fx.Node) and _is_rng_state(n)]
    if not states:
        return False
    rest = [n for n in saved if not (isinstance(n, torch.fx.Node) and _is_rng_state(n))]
    first = next(
        (i for i, n in enumerate(rest) if isinstance(n, torch.fx.Node) and _trails_tensors(n)), None
    )
    if first is None or saved.index(states[0]) <= saved.index(rest[first]):
        return False  # already among the checked tensors
    target = rest[first]
    bw_target = next((p for p in bw_inputs if p.name == target.name), None)
    bw_states = [p for p in bw_inputs if p.name.startswith("rng_state_output")]
    if bw_target is None or len(bw_states) != len(states):
        raise RuntimeError(
            "torchtitan compile: unexpected saved values around the random states of a "
            "recomputed op; cannot order them (see torchtitan/distributed/compile.py)"
        )
    new_saved = rest[:first] + states + rest[first:]
    fw_out.args = (type(fw_out.args[0])(outs[: len(outs) - n_saved] + new_saved),)
    for p in bw_states:
        bw_target.prepend(p)
    fw_module.recompile()
    bw_module.recompile()
    return True


def _patch_partitioner() -> None:
    """Wrap torch's `functionalize_rng_ops` (both partitioners call it through the module) so
    that its result is reordered by `_fix_rng_state_order`; once per process."""
    from torch._functorch import partitioners

    original = getattr(partitioners, "functionalize_rng_ops", None)
    if original is None or getattr(original, "_torchtitan_fixed", False):
        return

    def functionalize_rng_ops(joint_module, fw_module, bw_module, num_sym_nodes):
        fw_module, bw_module = original(joint_module, fw_module, bw_module, num_sym_nodes)
        _fix_rng_state_order(fw_module, bw_module)
        return fw_module, bw_module

    functionalize_rng_ops._torchtitan_fixed = True
    partitioners.functionalize_rng_ops = functionalize_rng_ops
