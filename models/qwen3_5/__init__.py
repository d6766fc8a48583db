"""Plain-torch Qwen3.5 text model (hybrid Gated DeltaNet + gated attention) on paged pools."""

from models.qwen3_5.config import CONFIGS, Qwen35Config, qwen3_5_0_8b, qwen3_5_2b, tiny
from models.qwen3_5.model import KV_POOL, PrefillBatch, PrefillChunk, Qwen35Model
from models.qwen3_5.state import Qwen35State

__all__ = [
    "CONFIGS",
    "KV_POOL",
    "PrefillBatch",
    "PrefillChunk",
    "Qwen35Config",
    "Qwen35Model",
    "Qwen35State",
    "qwen3_5_0_8b",
    "qwen3_5_2b",
    "tiny",
]
