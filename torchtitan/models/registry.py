"""Every model the framework trains, registered once. Torch-free: the config check reads
flavors and converters from here before any process starts.

A model is a package under torchtitan/models/ with
- `args.py`: its args dataclass and `FLAVORS` (name -> args), torch-free;
- `model.py`: the model class, which implements protocols.model.TrainableModel;
- `parallelize.py`: its parallelize function (TP plan, then the shared AC / compile / FSDP
  steps) and `TRAIN_SPEC` (protocols.train_spec.TrainSpec);
- optionally `hf_convert.py`: its Hugging Face weight converter (see hf_converters.py).
README.md, "Adding a model", walks through it.
"""

from dataclasses import dataclass

from torchtitan.models.deepseek_v3.args import FLAVORS as DEEPSEEK_V3_FLAVORS
from torchtitan.models.llama3.args import FLAVORS as LLAMA3_FLAVORS


@dataclass(frozen=True)
class ModelEntry:
    flavors: dict  # flavor name -> args dataclass
    package: str  # its parallelize module holds TRAIN_SPEC (imported only when training)
    hf_converter: str | None = None  # module of its Hugging Face weight converter, if any


MODELS: dict[str, ModelEntry] = {
    "llama3": ModelEntry(LLAMA3_FLAVORS, "torchtitan.models.llama3", "torchtitan.models.llama3.hf_convert"),
    "deepseek_v3": ModelEntry(DEEPSEEK_V3_FLAVORS, "torchtitan.models.deepseek_v3", "torchtitan.models.deepseek_v3.hf_convert"),
}
