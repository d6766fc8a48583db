"""A Hugging Face model directory as an adapter: its ``config.json`` mapped to our config, its weights read from
safetensors (``model.safetensors``, or the shards ``model.safetensors.index.json`` lists) and loaded strictly, and
the end-of-sequence tokens of ``generation_config.json``.

Architectures: ``Qwen3_5ForCausalLM``; ``Qwen3_5ForConditionalGeneration`` (the text model under ``text_config``,
its weights under ``model.language_model.``; the vision tower's ``model.visual.`` weights are skipped, with a note in
the log); ``WhisperForConditionalGeneration``. A tied output projection (``lm_head.weight``, Whisper's
``proj_out.weight``) may be absent from the files. Every problem is a ``CheckpointError`` naming the file, the
architecture or the weight: an unknown architecture, a missing, unexpected or misshapen weight, a weights file that is
missing, truncated or not safetensors.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import attrs
import torch

from models.engine import config_json
from models.qwen3_5.config import Qwen35Config
from models.whisper.config import WhisperConfig
from resplan.held import device_index

log = logging.getLogger(__name__)

QWEN_CAUSAL, QWEN_VL = "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"
WHISPER = "WhisperForConditionalGeneration"
ARCHITECTURES = (QWEN_CAUSAL, QWEN_VL, WHISPER)
TIED = {QWEN_CAUSAL: "lm_head.weight", QWEN_VL: "lm_head.weight", WHISPER: "proj_out.weight"}
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"


class CheckpointError(ValueError):
    """A model directory that cannot be served; the message names the file, architecture or weight."""


@attrs.frozen
class Checkpoint:
    """What a model directory says, before any weight is read."""

    path: Path
    architecture: str  # one of ARCHITECTURES
    config: Qwen35Config | WhisperConfig
    dtype: torch.dtype  # the weights' dtype as the checkpoint declares it (float32 where it does not)
    eos_token_ids: tuple[int, ...]  # generation_config.json's eos_token_id, else config.json's
    generation: dict  # generation_config.json (empty when there is none): Whisper's language and task tokens

    @property
    def name(self) -> str:
        return self.path.name


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


@contextlib.contextmanager
def _open_weights(f: Path):
    """safe_open of one safetensors file; a file that is missing, unreadable, truncated or not safetensors, or a
    tensor it cannot give, is a CheckpointError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(f, "pt") as st:
            yield st
    except OSError as e:
        raise CheckpointError(f"{f}: {e.strerror or e}") from None
    except SafetensorError as e:
        raise CheckpointError(f"{f}: not a valid safetensors file (truncated or corrupted?): {e}") from None


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The directory's architecture, our config of it, its dtype and EOS tokens (CheckpointError on a problem)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (a model directory holds config.json and safetensors)")
    raw = _json(path / "config.json")
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(f"{path / 'config.json'}: architectures {archs or '(none)'}: this engine serves "
                              f"{', '.join(ARCHITECTURES)}")  # fmt: skip
    try:
        if arch == WHISPER:
            cfg = WhisperConfig.from_hf(config_json.whisper(raw))
        elif arch == QWEN_VL:
            text, tied = config_json.qwen_vl(raw)
            cfg = Qwen35Config.from_hf(text, path.name, tie_word_embeddings=tied)
        else:
            cfg = Qwen35Config.from_hf(config_json.qwen_text(raw), path.name)
    except (ValueError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{path / 'config.json'}: {arch}: {e}") from None
    declared = config_json.dtype_name(raw)
    if declared is None and arch == QWEN_VL:
        declared = config_json.dtype_name(raw.get("text_config") or {})
    if declared and not isinstance(getattr(torch, declared, None), torch.dtype):
        raise CheckpointError(f"{path / 'config.json'}: dtype {declared!r} is not a torch dtype")
    declared = getattr(torch, declared) if declared else None
    gen = _json(path / "generation_config.json") if (path / "generation_config.json").exists() else {}
    eos = _ids(gen.get("eos_token_id")) or _ids(raw.get("eos_token_id") or (raw.get("text_config") or {}).get(
        "eos_token_id"))  # fmt: skip
    return Checkpoint(path, arch, cfg, declared or torch.float32, eos, gen)


def _weight_files(path: Path) -> dict[str, Path]:
    """Weight name -> the safetensors file holding it."""
    if (path / INDEX).exists():
        index = _json(path / INDEX)
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise CheckpointError(f"{path / INDEX}: no weight_map")
        files = {name: path / f for name, f in wmap.items()}
        for f in sorted(set(files.values())):
            if not f.exists():
                raise CheckpointError(f"{path / INDEX} names {f.name}, which is not in {path}")
        return files
    if (path / SINGLE).exists():
        with _open_weights(path / SINGLE) as f:
            return {name: path / SINGLE for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    raise CheckpointError(f"{path}: no {SINGLE} and no {INDEX} (only safetensors weights are read)")


def _our_name(arch: str, name: str) -> str | None:
    """The weight's name in our state_dict, or None for one we skip (a vision tower's)."""
    if arch != QWEN_VL:
        return name
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("model.visual."):
        return None
    return name  # lm_head.weight, or an unexpected name that the strict check reports


def load_weights(ckpt: Checkpoint, model: torch.nn.Module) -> None:
    """Every weight of ``model`` from the checkpoint's safetensors, strictly: each file weight must be one of ours with
    our shape, and each of ours must be there (a tied output projection may be absent). Copies into the model's own
    tensors (their device and dtype)."""
    files = _weight_files(ckpt.path)
    ours = model.state_dict()
    tied = TIED[ckpt.architecture] if getattr(ckpt.config, "tie_word_embeddings", False) else None
    names, skipped = {}, 0
    for name in files:
        mine = _our_name(ckpt.architecture, name)
        if mine is None:
            skipped += 1
        elif mine not in ours:
            raise CheckpointError(f"{files[name]}: unexpected weight {name!r} ({ckpt.architecture} has no such "
                                  "parameter here)")  # fmt: skip
        elif mine != tied:  # a tied projection is the embedding: loading both would let the file's copy win
            names[name] = mine
    missing = sorted(set(ours) - set(names.values()) - {tied})
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{ckpt.path}: missing weight {missing[0]!r}{', ' if len(missing) > 1 else ''}"
                              f"{', '.join(repr(m) for m in missing[1:3])}{more}")  # fmt: skip
    if skipped:
        log.info("%s: %d vision-tower weights skipped (the engine serves the text model)", ckpt.path, skipped)
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad():
        for f, group in by_file.items():
            with _open_weights(f) as st:
                absent = sorted(set(group) - set(st.keys()))
                if absent:
                    raise CheckpointError(f"{f}: no weight {absent[0]!r}, which {INDEX} places there")
                for name in group:
                    t, dst = st.get_tensor(name), ours[names[name]]
                    if tuple(t.shape) != tuple(dst.shape):
                        raise CheckpointError(f"{f}: weight {name!r} has shape {tuple(t.shape)}, the model's is "
                                              f"{tuple(dst.shape)}")  # fmt: skip
                    dst.copy_(t)


def load_adapter(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
    """The model of a Hugging Face directory, its weights loaded, as an engine adapter: in ``dtype`` (default: the
    checkpoint's) on ``device``, with the checkpoint's EOS tokens as every request's default stops."""
    from models.engine.adapters import QwenAdapter, WhisperAdapter
    from models.qwen3_5 import Qwen35Model
    from models.whisper import WhisperModel

    ckpt = read_checkpoint(path)
    device = torch.device(device)
    gpu = [device_index(device)] if device.type == "cuda" else []
    # the model is made on its device (a random init of a billion weights takes seconds on a CPU, milliseconds on a
    # GPU), and its init is overwritten: the caller's RNGs are kept as they were
    with torch.random.fork_rng(devices=gpu), device:
        if ckpt.architecture == WHISPER:
            adapter = WhisperAdapter(ckpt.name, WhisperModel(ckpt.config))
        else:
            adapter = QwenAdapter(ckpt.name, Qwen35Model(ckpt.config))
    adapter.model.to(device=device, dtype=dtype or ckpt.dtype).eval()
    load_weights(ckpt, adapter.model)
    if hasattr(adapter.model, "fuse_projections"):
        adapter.model.fuse_projections()  # after the weights: the fused GEMM weights are views built from them
    adapter.eos_token_ids = ckpt.eos_token_ids
    adapter.checkpoint = ckpt
    return adapter
