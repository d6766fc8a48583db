"""How an engine serves: ``EngineConfig``, every choice resolved when it is built and every check between its fields
made there, once; and ``PrefillPlacement``, where a step's prefill pass runs relative to its decode rows.

A field whose default depends on another (the placement on the device, the token budget on the placement) is
computed at construction: a built config holds only the values the engine runs with. What depends on the model (its
context, its weights' dtype, whether its pass can be captured) is checked against an adapter by ``check_fits``.
"""

from __future__ import annotations

import enum

import attrs
import torch

from kernels.choices import KernelChoices
from models.engine.scheduler import Order
from models.layers.decode_attention import Backend


class Planning(enum.Enum):
    RESIDENT = "resident"  # decode steps planned through resplan: rows live in the device store
    HOST = "host"  # every decode step's buffers rebuilt from the streams on the host


class PrefillPlacement(enum.Enum):
    """Where a step's prefill pass runs relative to the step's decode rows."""

    IN_STEP = "in-step"  # inside its step: the rows run in a decode graph launched before the pass, and wait for it
    IN_PASS = "in-pass"  # the rows ride in the pass, one token each, counted in the token budget: one forward a step
    BESIDE = "beside"  # on a CUDA stream of its own: decode steps go on beside it, its requests join when it lands
    BESIDE_PRIORITY = "beside-priority"  # BESIDE, the engine's steps on a stream of higher CUDA priority than the pass

    @property
    def beside(self) -> bool:
        """The pass runs on a stream of its own while decode steps go on (one pass in flight at a time)."""
        return self in (PrefillPlacement.BESIDE, PrefillPlacement.BESIDE_PRIORITY)


# the token budget a config gets by default, by where its passes run (measured on the H200 under a burst, Poisson
# traffic and long prompts: models/bench/results/README.md, "Prefill")
IN_STEP_TOKEN_BUDGET = 1024  # every decode row waits for the pass: the best of 512 / 1024 / 2048
BESIDE_TOKEN_BUDGET = 2048  # the rows run beside it: long prompts' TTFT p99 81 -> 59 ms at 1024 -> 2048
DECODE_STREAM_PRIORITY = -1  # BESIDE_PRIORITY: the engine's step stream, above the passes' stream at priority 0
CHECKPOINTS_PER_ROW = 4  # the checkpoint pool's default size, per request running at once
CHECKPOINT_GRID = 64  # the delta rule's chunk: a pass saves states only where its chunks start
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)  # EngineConfig.state_dtype
DEFAULT_CONTEXT = 256  # EngineConfig.max_seq_len's default where the model's is longer (the KV pools hold every
# running request at the context: a serving context is chosen by models.engine.serving)


def _positive_or_none(_inst, attribute, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 (or None), got {value}")


def _positive(_inst, attribute, value) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _token_budget(_inst, attribute, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{attribute.name} must be > 0 or None (whole prompts), got {value!r}")


def _dtype(_inst, attribute, value) -> None:
    if value is not None and value not in DTYPES:
        raise ValueError(f"{attribute.name} must be one of {', '.join(map(str, DTYPES))} (or None), got {value!r}")


def _state_dtype(_inst, attribute, value) -> None:
    if value not in STATE_DTYPES:
        raise ValueError(f"{attribute.name} must be one of {', '.join(map(str, STATE_DTYPES))}, got {value!r}")


def _default_placement(cfg: EngineConfig) -> PrefillPlacement:
    """Beside the decode steps where the device has streams (CUDA), else in the step."""
    return PrefillPlacement.BESIDE if torch.device(cfg.device).type == "cuda" else PrefillPlacement.IN_STEP


def _default_checkpoints(cfg: EngineConfig) -> int:
    return CHECKPOINTS_PER_ROW * cfg.max_running if cfg.prefix_cache else 0


def _default_budget(cfg: EngineConfig) -> int:
    return BESIDE_TOKEN_BUDGET if cfg.prefill.beside else IN_STEP_TOKEN_BUDGET


@attrs.frozen
class EngineConfig:
    """How an engine serves: its planning arm, concurrency and buckets, decode order, pools, prefill placement and
    budget, attention and kernels. Built once; every field holds the value the engine runs with."""

    planning: Planning = Planning.RESIDENT
    max_running: int = attrs.field(default=8, validator=_positive)  # requests admitted at once (concurrency)
    max_bucket: int | None = attrs.field(default=None, validator=_positive_or_none)  # widest bucket; None: max_running
    order: Order = Order.ARRIVAL
    page_size: int = attrs.field(default=16, validator=_positive)
    num_pages: int | None = attrs.field(default=None, validator=_positive_or_none)  # per APPEND pool, sink included
    # the context a stream may fill; None: the model's, at most DEFAULT_CONTEXT (resolved by ``fit``)
    max_seq_len: int | None = attrs.field(default=None, validator=_positive_or_none)
    rec_slots: int | None = attrs.field(default=None, validator=_positive_or_none)  # sink included; None: c + 1
    row_check: bool = False  # compare every row a resident step read with the streams (syncs; debug)
    prepare_early: bool = True  # prepare the next step while this one runs, as a pipelined engine does
    device: str = "cpu"
    # model weights and KV caches; None: the weights' own (random weights: float32; a checkpoint: its dtype)
    dtype: torch.dtype | None = attrs.field(default=None, validator=_dtype)
    attention: Backend = Backend.TORCH  # decode attention: TORCH, FA2 or XQA (CUDA), TRITON (CUDA, or interpreted)
    timing: bool = False  # ITL samples, decode graph and prefill GPU time (CUDA events; a prefill pass then syncs)
    overlap: bool = False  # launch each decode step before reading the last one's tokens (input ids on the device)
    prefill_graphs: int = attrs.field(default=0, validator=attrs.validators.ge(0))  # token buckets of prefill graphs
    prefill_graph_tokens: int = attrs.field(default=8192, validator=_positive)  # the largest; longer passes eager
    # where a step's pass runs; default: BESIDE on CUDA, IN_STEP elsewhere
    prefill: PrefillPlacement = attrs.field(default=attrs.Factory(_default_placement, takes_self=True))
    # prompt tokens a step's pass holds (IN_PASS: its decode rows' included); None: whole prompts. Default: by placement
    token_budget: int | None = attrs.field(default=attrs.Factory(_default_budget, takes_self=True),
                                           validator=_token_budget)  # fmt: skip
    kernels: KernelChoices = KernelChoices()  # kernel forms: the decode path and its folds, PDL, the prefill kernels
    # share KV pages by the token chain that wrote them and restore recurrent-state checkpoints (prefix_cache.py)
    prefix_cache: bool = False
    # checkpoint slots beside the requests' in the recurrent pools; default 4 x max_running with the cache, else 0
    checkpoints: int = attrs.field(default=attrs.Factory(_default_checkpoints, takes_self=True),
                                   validator=attrs.validators.ge(0))  # fmt: skip
    checkpoint_interval: int = attrs.field(default=256, validator=_positive)  # tokens between a prompt's checkpoints
    # the recurrent (GDN) state's dtype in the pools; bfloat16 halves its traffic (1 MiB a row and layer read and
    # written each step at float32) at a cost in accuracy: an option, not the default. The math stays float32
    state_dtype: torch.dtype = attrs.field(default=torch.float32, validator=_state_dtype)
    # decode tokens a row runs per graph launch: k > 1 captures graphs of k sub-steps (each gathering the rows from the
    # store, drawing a token, committing +1), so the host plans, launches and reads back once per k tokens; a step
    # whose rows ask for logprobs, or one of which would write past its context, runs one. Resident planning only
    tokens_per_launch: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        cuda = torch.device(self.device).type == "cuda"
        if self.max_bucket is not None and self.max_bucket > self.max_running:
            raise ValueError(f"max_bucket {self.max_bucket} is more than max_running {self.max_running}: no step has "
                             "more rows than running requests")  # fmt: skip
        widest = self.widest_bucket
        if self.prefill is PrefillPlacement.IN_PASS and self.token_budget is not None and self.token_budget <= widest:
            raise ValueError(f"prefill IN_PASS: token_budget {self.token_budget} leaves no prompt token beside "
                             f"{widest} decode rows; give it more than max_bucket (or max_running)")  # fmt: skip
        if self.prefill is PrefillPlacement.BESIDE_PRIORITY and not cuda:
            raise ValueError(f"prefill BESIDE_PRIORITY ranks the steps' CUDA stream above the passes'; device "
                             f"{self.device} has no streams")  # fmt: skip
        if self.prefix_cache and self.checkpoints < 1:
            raise ValueError("prefix_cache needs checkpoints >= 1 (slots for the recurrent-state checkpoints)")
        interval = self.checkpoint_interval
        if self.prefix_cache and (interval % CHECKPOINT_GRID or interval % self.page_size):
            raise ValueError(f"checkpoint_interval {self.checkpoint_interval} must be a multiple of the delta rule's "
                             f"chunk ({CHECKPOINT_GRID}) and of page_size ({self.page_size})")  # fmt: skip
        k = self.tokens_per_launch
        if k > 1 and self.planning is not Planning.RESIDENT:
            raise ValueError(f"tokens_per_launch {k} needs resident planning: a host-planned step's buffers are the "
                             "host's, refilled for every token")  # fmt: skip
        if k > 1 and self.attention is Backend.FA2:
            raise ValueError(f"tokens_per_launch {k} needs an attention without a host plan (torch, triton or xqa): "
                             "fa2 plans each token's step on the host")  # fmt: skip
        if k > self.page_size:
            raise ValueError(f"tokens_per_launch {k} is more than page_size {self.page_size}: a row could open two "
                             "pages in one launch")  # fmt: skip
        if self.attention in (Backend.FA2, Backend.XQA) and not cuda:
            raise ValueError(f"attention {self.attention.value} runs on CUDA only; on {self.device} use torch or "
                             f"triton (Backend.TORCH / Backend.TRITON)")  # fmt: skip

    @property
    def widest_bucket(self) -> int:
        """The widest decode bucket: ``max_bucket``, or ``max_running``."""
        return self.max_bucket or self.max_running

    @property
    def largest_pass(self) -> int:
        """The most tokens a prefill pass holds: the token budget (None: whole prompts), and never more than every
        running request's whole context (``max_seq_len`` resolved: a ``fit`` config's)."""
        whole = self.max_running * self.max_seq_len
        return whole if self.token_budget is None else min(self.token_budget, whole)


def fit(config: EngineConfig, adapter) -> EngineConfig:
    """``config`` for ``adapter``'s model: its context resolved (None: the model's, at most DEFAULT_CONTEXT), and
    checked (``check_fits``)."""
    if config.max_seq_len is None:
        config = attrs.evolve(config, max_seq_len=min(adapter.max_context, DEFAULT_CONTEXT))
    check_fits(config, adapter)
    return config


def check_fits(config: EngineConfig, adapter) -> None:
    """ValueError where ``config`` asks of ``adapter``'s model what it has not: a context longer than the model's,
    a dtype other than its weights', prefill graphs of a pass it cannot capture."""
    if config.max_seq_len is not None and config.max_seq_len > adapter.max_context:
        raise ValueError(f"max_seq_len {config.max_seq_len} is longer than {adapter.name}'s context of "
                         f"{adapter.max_context} tokens")  # fmt: skip
    w = next(adapter.model.parameters())
    if config.dtype is not None and config.dtype != w.dtype:
        raise ValueError(f"EngineConfig.dtype is {config.dtype} but {adapter.name}'s weights are {w.dtype}: build the "
                         "adapter in that dtype, or leave dtype None")  # fmt: skip
    if config.state_dtype != torch.float32 and not adapter.recurrent:
        raise ValueError(f"state_dtype: {adapter.name} keeps no recurrent state")
    if config.prefix_cache and not (adapter.recurrent and len(adapter.pools) == 1):
        raise ValueError(f"prefix_cache serves a hybrid model with one KV pool and recurrent state (Qwen3.5); "
                         f"{adapter.name} has pools {[p.key for p in adapter.pools]}")  # fmt: skip
    refusal = adapter.prefill_capture_refusal(config.kernels) if config.prefill_graphs else None
    if refusal is not None:
        raise ValueError(f"prefill_graphs: {adapter.name} cannot capture its prefill pass: {refusal}; use "
                         "prefill_graphs=0")  # fmt: skip
