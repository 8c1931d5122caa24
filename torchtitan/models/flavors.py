"""Model name -> flavor shapes, importable without torch (used by the config check)."""

from torchtitan.models.deepseek_v3.args import FLAVORS as DEEPSEEK_V3_FLAVORS
from torchtitan.models.llama3.args import FLAVORS as LLAMA3_FLAVORS

MODEL_FLAVORS: dict[str, dict] = {
    "llama3": LLAMA3_FLAVORS,
    "deepseek_v3": DEEPSEEK_V3_FLAVORS,
}
