"""Whisper (encoder-decoder ASR) with a paged decoder: a "self" APPEND pool and a "cross" READ pool."""

from models.whisper.config import CONFIGS, WhisperConfig, get_config, tiny, whisper_large_v3, whisper_tiny
from models.whisper.model import DecoderChunk, WhisperModel
from models.whisper.pools import PagedState

__all__ = [
    "CONFIGS",
    "DecoderChunk",
    "PagedState",
    "WhisperConfig",
    "WhisperModel",
    "get_config",
    "tiny",
    "whisper_large_v3",
    "whisper_tiny",
]
