"""Model name -> flavor shapes, importable without torch (used by the config check)."""

from torchtitan.models.llama3.args import FLAVORS as LLAMA3_FLAVORS

MODEL_FLAVORS: dict[str, dict] = {
    "llama3": LLAMA3_FLAVORS,
}
