"""Audio in, for Whisper: a 16 kHz waveform (an array or a WAV file) to the log-mel features its encoder reads
(transformers' ``WhisperFeatureExtractor``, the checkpoint's ``preprocessor_config.json`` where there is one), and
the decoder prompt a transcription starts from (start, language and task tokens, from ``generation_config.json``).

One window only: the encoder reads ``2 * max_source_positions`` mel frames (30 s for the released models); longer
audio is refused, not cut (long-form transcription stitches windows, which this engine does not do).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

SAMPLE_RATE = 16_000


class AudioError(ValueError):
    """Audio the engine cannot take; the message says why (and what it would take)."""


def read_wav(path: str | Path) -> np.ndarray:
    """A 16 kHz PCM WAV file as float32 samples in [-1, 1], channels averaged."""
    try:
        with wave.open(str(path), "rb") as w:
            rate, width, channels, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            raw = w.readframes(n)
    except (OSError, wave.Error, EOFError) as e:
        raise AudioError(f"{path}: not a PCM WAV file ({e})") from None
    if rate != SAMPLE_RATE:
        raise AudioError(f"{path}: {rate} Hz; Whisper takes {SAMPLE_RATE} Hz audio (resample it first, e.g. "
                         f"ffmpeg -i IN -ar {SAMPLE_RATE} -ac 1 OUT.wav)")  # fmt: skip
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        x = np.frombuffer(raw, np.int16 if width == 2 else np.int32).astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise AudioError(f"{path}: {8 * width}-bit samples; 8, 16 and 32-bit PCM are read")
    return x.reshape(-1, channels).mean(axis=1)


def feature_extractor(path: str | Path | None, num_mel_bins: int):
    """The checkpoint's feature extractor (its preprocessor_config.json), else Whisper's defaults for that many bins."""
    from transformers import WhisperFeatureExtractor

    if path is not None and (Path(path) / "preprocessor_config.json").exists():
        fe = WhisperFeatureExtractor.from_pretrained(path, local_files_only=True)
    else:
        fe = WhisperFeatureExtractor(feature_size=num_mel_bins)
    if fe.feature_size != num_mel_bins:
        raise AudioError(f"the feature extractor makes {fe.feature_size} mel bins, the model reads {num_mel_bins}")
    return fe


def log_mel(waveform: np.ndarray, extractor, n_frames: int) -> torch.Tensor:
    """[n_mels, n_frames] float32 log-mel features of one 16 kHz waveform, padded to the encoder's window."""
    x = np.asarray(waveform, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise AudioError(f"a waveform is a non-empty 1-D array of samples, got shape {x.shape}")
    window = n_frames * extractor.hop_length
    if x.size > window:
        raise AudioError(f"{x.size / SAMPLE_RATE:.1f} s of audio; the encoder reads {window / SAMPLE_RATE:.1f} s at "
                         "once (split longer audio into windows)")  # fmt: skip
    out = extractor(x, sampling_rate=SAMPLE_RATE, return_tensors="pt", padding="max_length", max_length=window,
                    truncation=True)  # fmt: skip
    return out.input_features[0].float()


def decoder_prompt(generation: dict, decoder_start: int, language: str | None = "en", task: str = "transcribe",
                   timestamps: bool = False) -> list[int]:
    """Whisper's decoder prompt: the start token, then for a multilingual checkpoint its language and task tokens,
    then no-timestamps (unless ``timestamps``), from ``generation_config.json``."""
    out = [int(generation.get("decoder_start_token_id", decoder_start))]
    langs, tasks = generation.get("lang_to_id") or {}, generation.get("task_to_id") or {}
    if langs:
        key = language if language is None or language.startswith("<|") else f"<|{language}|>"
        if key not in langs:
            raise AudioError(f"language {language!r} is not one of the checkpoint's "
                             f"({', '.join(sorted(k.strip('<|>') for k in langs)[:12])}, ...)")  # fmt: skip
        if task not in tasks:
            raise AudioError(f"task {task!r} is not one of the checkpoint's ({', '.join(sorted(tasks))})")
        out += [int(langs[key]), int(tasks[task])]
    no_ts = generation.get("no_timestamps_token_id")
    if no_ts is not None and not timestamps:
        out.append(int(no_ts))
    return out
