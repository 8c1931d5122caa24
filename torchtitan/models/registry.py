"""Every model the framework trains: one entry per model. Torch-free: the checks read flavors,
shapes and converters from here before any process starts.

A model is one package and one entry. The package holds
- `args.py`: its args dataclass (implements models.protocol.ModelArgs) and `FLAVORS` (name ->
  args), torch-free;
- `shapes.py`: `shapes(args) -> models.shapes.ModelShapes`, every parameter with its shape and
  how TP and EP split it, torch-free (the pre-launch model-states check reads it);
- `model.py`: the model class, which implements models.protocol.TrainableModel;
- `parallelize.py`: its parallelize function (TP plan, then the shared AC / compile / FSDP
  steps) and `TRAIN_SPEC` (models.train_spec.TrainSpec);
- optionally `hf_convert.py`: its Hugging Face weight converter (models/hf/converters.py).

The entry (`register`) names the package and its flavors. A package outside this repository
registers itself the same way from a module the job names with `[model] module`
(`load_model_modules`): the checks and every worker import it before looking the model up.
docs/adding_a_model.md walks through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torchtitan.models.deepseek_v3.args import FLAVORS as DEEPSEEK_V3_FLAVORS
from torchtitan.models.llama3.args import FLAVORS as LLAMA3_FLAVORS
from torchtitan.models.qwen3.args import FLAVORS as QWEN3_FLAVORS


@dataclass(frozen=True)
class ModelEntry:
    flavors: dict  # flavor name -> args dataclass (models.protocol.ModelArgs)
    package: str  # holds shapes.py, model.py and parallelize.py (TRAIN_SPEC), imported when needed
    hf_converter: str | None = None  # module of its Hugging Face weight converter, if any

    def module(self, name: str):
        """One of the package's modules ("shapes", "parallelize", ...), imported now."""
        return importlib.import_module(f"{self.package}.{name}")


MODELS: dict[str, ModelEntry] = {}


def register(name: str, entry: ModelEntry) -> None:
    """Add a model; registering the same name again with another entry is an error (a
    re-import of the registering module, with an equal entry, is not)."""
    if name in MODELS and MODELS[name] != entry:
        raise ValueError(f"model {name!r} is already registered (package {MODELS[name].package})")
    MODELS[name] = entry


def model_entry(name: str) -> ModelEntry:
    """The entry of `name`; KeyError (with the registered names) when there is none."""
    if name not in MODELS:
        raise KeyError(f"no model {name!r} is registered (registered: {', '.join(MODELS)})")
    return MODELS[name]


def load_model_modules(modules: str) -> None:
    """Import the comma-separated modules of `[model] module` (each registers its models).
    ImportError (with the module's name) when one cannot be imported."""
    for name in (m.strip() for m in modules.split(",")):
        if name:
            importlib.import_module(name)


register(
    "llama3",
    ModelEntry(LLAMA3_FLAVORS, "torchtitan.models.llama3", "torchtitan.models.llama3.hf_convert"),
)
register(
    "deepseek_v3",
    ModelEntry(
        DEEPSEEK_V3_FLAVORS,
        "torchtitan.models.deepseek_v3",
        "torchtitan.models.deepseek_v3.hf_convert",
    ),
)
register(
    "qwen3",
    ModelEntry(QWEN3_FLAVORS, "torchtitan.models.qwen3", "torchtitan.models.qwen3.hf_convert"),
)
