"""The serving engine: request validation, pools and admission, scheduler, request table, sampler, model adapters,
the two planning arms (resident through resplan, and the host-planned baseline), and the driver that composes them."""

from models.engine.adapters import MODELS, Adapter, QwenAdapter, WhisperAdapter, build_adapter
from models.engine.config import (
    BESIDE_TOKEN_BUDGET,
    IN_STEP_TOKEN_BUDGET,
    EngineConfig,
    Planning,
    PrefillPlacement,
    check_fits,
)
from models.engine.driver import Engine
from models.engine.host_arm import HostFill
from models.engine.pools import AdmitRefusal, AdmitRefused, AdmitTxn, PagePool, SlotPool, handle_pool, recurrent_pool
from models.engine.requests import (
    FinishReason,
    InvalidRequest,
    Limits,
    Request,
    Result,
    SamplingParams,
    StepOutput,
    validate,
)
from models.engine.sampler import Sampler
from models.engine.scheduler import DEFAULT_BUCKETS, Batch, Chunk, Order, Scheduler, Status, decode_buckets
from models.engine.stats import EngineStats

__all__ = [
    "BESIDE_TOKEN_BUDGET", "DEFAULT_BUCKETS", "IN_STEP_TOKEN_BUDGET", "MODELS", "Adapter", "AdmitRefusal",
    "AdmitRefused", "AdmitTxn", "Batch", "Chunk", "Engine", "EngineConfig", "EngineStats", "FinishReason", "HostFill",
    "InvalidRequest", "Limits", "Order", "PagePool", "Planning", "PrefillPlacement", "QwenAdapter", "Request",
    "Result", "Sampler", "SamplingParams", "Scheduler", "SlotPool", "Status", "StepOutput", "WhisperAdapter",
    "build_adapter", "check_fits", "decode_buckets", "handle_pool", "recurrent_pool", "validate",
]
