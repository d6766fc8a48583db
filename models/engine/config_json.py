"""A checkpoint's ``config.json`` as transformers 5 reads the fields the engine maps (``Qwen35Config.from_hf``,
``WhisperConfig.from_hf``), without importing transformers: that import (it scans every installed distribution and
loads what its generation utilities use, scikit-learn where it is installed) took ~3 s of a server's warm start on
the H200 under a profiler, and 1.8 s on a CPU without scikit-learn.

Each default below is the transformers config class's, and each rule one its ``__post_init__`` applies to the fields
we read; ``tests/test_checkpoints.py`` holds both against transformers, on configs with every such field left out.
A field of the wrong JSON type is a ValueError naming it (transformers' strict configs refuse it too).
"""

from __future__ import annotations

from types import SimpleNamespace

QWEN_TEXT = dict(  # transformers.Qwen3_5TextConfig's defaults, for the fields from_hf reads
    vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
    num_key_value_heads=4, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, eos_token_id=None,
)  # fmt: skip
QWEN_VL_TIED = False  # transformers.Qwen3_5Config's tie_word_embeddings (the wrapper's, which decides it)
FULL_ATTENTION_INTERVAL = 4  # layer_types where none are listed: every 4th layer full attention, the rest linear
LEGACY_LAYER_TYPES = {"conv": "linear_attention", "mamba": "linear_attention", "attention": "full_attention"}
ROPE_THETA = 10_000.0  # rope_theta where neither rope_parameters nor the config has one
PARTIAL_ROTARY_FACTOR = 0.25  # Qwen3.5's, where neither has one

WHISPER = dict(  # transformers.WhisperConfig's defaults, for the fields from_hf reads
    vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, encoder_attention_heads=6,
    encoder_ffn_dim=1536, decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536,
    max_source_positions=1500, max_target_positions=448, decoder_start_token_id=50257, pad_token_id=50256,
    bos_token_id=50256, eos_token_id=50256, begin_suppress_tokens=(220, 50256), activation_function="gelu",
    tie_word_embeddings=True, init_std=0.02, scale_embedding=False,
)  # fmt: skip
WHISPER_ALIASES = {"hidden_size": "d_model", "num_hidden_layers": "encoder_layers",
                   "num_attention_heads": "encoder_attention_heads"}  # WhisperConfig.attribute_map  # fmt: skip


KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _fields(raw: dict, defaults: dict, what: str) -> dict:
    """``defaults`` overridden by ``raw``'s values (JSON null included, as transformers takes it), each checked
    against its default's type: an int field takes an int, a float field a number, a bool a bool, a str a str."""
    out = dict(defaults)
    for name, default in defaults.items():
        if name not in raw:
            continue
        value = raw[name]
        want = type(default)
        ok = (value is None or default is None or want is tuple or (want is float and type(value) in (int, float))
              or (want is not float and type(value) is want))  # fmt: skip
        if not ok:
            raise ValueError(f"{what}{name} is {value!r}, not {KINDS[want]}")
        out[name] = value
    return out


def dtype_name(raw: dict) -> str | None:
    """The weights' dtype as config.json names it (``dtype``, or transformers 4's ``torch_dtype``)."""
    return raw.get("dtype") or raw.get("torch_dtype")


def qwen_text(raw: dict, what: str = "") -> SimpleNamespace:
    """Qwen3_5TextConfig's view of a text config: its defaults where a field is absent; ``layer_types`` from the
    full-attention interval where none are listed, legacy names renamed; ``rope_parameters`` holding ``rope_theta``,
    ``partial_rotary_factor`` and ``rope_type`` (from the top level or the defaults where the dict has none)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{what or 'the config'} is {type(raw).__name__}, not an object")
    cfg = _fields(raw, QWEN_TEXT, what)
    layers = raw.get("layer_types")
    if layers is None:
        every = raw.get("full_attention_interval", FULL_ATTENTION_INTERVAL)
        layers = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                  for i in range(cfg["num_hidden_layers"])]  # fmt: skip
    cfg["layer_types"] = [LEGACY_LAYER_TYPES.get(t, t) for t in layers]
    rope = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    rope.setdefault("rope_theta", raw.get("rope_theta", ROPE_THETA))
    rope.setdefault("partial_rotary_factor", raw.get("partial_rotary_factor", PARTIAL_ROTARY_FACTOR))
    rope.setdefault("rope_type", rope.get("type", "default"))
    cfg["rope_parameters"] = rope
    return SimpleNamespace(**cfg)


def qwen_vl(raw: dict) -> tuple[SimpleNamespace, bool]:
    """A Qwen3_5Config's text model (its ``text_config``, Qwen3_5TextConfig's defaults where it has none) and whether
    its output projection is tied (the wrapper's field)."""
    text = raw.get("text_config") or {}
    tied = _fields(raw, {"tie_word_embeddings": QWEN_VL_TIED}, "")["tie_word_embeddings"]
    return qwen_text(text, "text_config."), bool(tied)


def whisper(raw: dict) -> SimpleNamespace:
    """WhisperConfig's view of a config: its defaults where a field is absent, its aliases (``hidden_size``...) read
    where the canonical name is."""
    named = dict(raw)
    for alias, name in WHISPER_ALIASES.items():
        if alias in raw and name not in raw:
            named[name] = raw[alias]
    return SimpleNamespace(**_fields(named, WHISPER, ""))
