"""The serving engine: request validation, pools and admission, scheduler, request table, sampler, model adapters,
the two planning arms (resident through resplan, and the host-planned baseline), and the driver that composes them.

The names below are imported on first use (PEP 562), so that importing one submodule (the server's front end reads
``models.engine.text``) does not build the whole engine's imports (torch, Triton, the model code)."""

from __future__ import annotations

import importlib

_WHERE = {  # name -> the submodule that defines it
    "Adapter": "models.engine.adapters",
    "MODELS": "models.engine.adapters",
    "QwenAdapter": "models.engine.adapters",
    "WhisperAdapter": "models.engine.adapters",
    "build_adapter": "models.engine.adapters",
    "BESIDE_TOKEN_BUDGET": "models.engine.config",
    "EngineConfig": "models.engine.config",
    "IN_STEP_TOKEN_BUDGET": "models.engine.config",
    "Planning": "models.engine.config",
    "PrefillPlacement": "models.engine.config",
    "check_fits": "models.engine.config",
    "Engine": "models.engine.driver",
    "HostFill": "models.engine.host_arm",
    "AdmitRefusal": "models.engine.pools",
    "AdmitRefused": "models.engine.pools",
    "AdmitTxn": "models.engine.pools",
    "PagePool": "models.engine.pools",
    "SlotPool": "models.engine.pools",
    "handle_pool": "models.engine.pools",
    "recurrent_pool": "models.engine.pools",
    "FinishReason": "models.engine.requests",
    "InvalidRequest": "models.engine.requests",
    "Limits": "models.engine.requests",
    "Request": "models.engine.requests",
    "Result": "models.engine.requests",
    "SamplingParams": "models.engine.requests",
    "StepOutput": "models.engine.requests",
    "validate": "models.engine.requests",
    "Sampler": "models.engine.sampler",
    "Batch": "models.engine.scheduler",
    "Chunk": "models.engine.scheduler",
    "DEFAULT_BUCKETS": "models.engine.scheduler",
    "Order": "models.engine.scheduler",
    "Scheduler": "models.engine.scheduler",
    "Status": "models.engine.scheduler",
    "decode_buckets": "models.engine.scheduler",
    "EngineStats": "models.engine.stats",
}

__all__ = [
    "BESIDE_TOKEN_BUDGET", "DEFAULT_BUCKETS", "IN_STEP_TOKEN_BUDGET", "MODELS", "Adapter", "AdmitRefusal",
    "AdmitRefused", "AdmitTxn", "Batch", "Chunk", "Engine", "EngineConfig", "EngineStats", "FinishReason", "HostFill",
    "InvalidRequest", "Limits", "Order", "PagePool", "Planning", "PrefillPlacement", "QwenAdapter", "Request",
    "Result", "Sampler", "SamplingParams", "Scheduler", "SlotPool", "Status", "StepOutput", "WhisperAdapter",
    "build_adapter", "check_fits", "decode_buckets", "handle_pool", "recurrent_pool", "validate",
]


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'models.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
