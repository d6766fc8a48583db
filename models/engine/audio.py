"""Audio in, for Whisper: a 16 kHz waveform (an array, or a PCM WAV file of any rate, ``resample``d) to the log-mel
features its encoder reads (transformers' ``WhisperFeatureExtractor`` with the checkpoint's settings:
``processor_config.json``'s ``feature_extractor``, as transformers 5 saves a processor, else
``preprocessor_config.json``; with neither, Whisper's defaults and a warning), and the decoder prompt a
transcription starts from (start, language and task tokens, from ``generation_config.json``), its language where
none is given detected as Whisper detects it: the most likely language token after the start token (``detected``).

The encoder reads one window of ``2 * max_source_positions`` mel frames (30 s for the released models). Longer audio
is cut into windows first (``windows``: each cut at the quietest 10 ms of the second before the window's end, so
that a cut falls in a pause where there is one, as vLLM cuts it), each transcribed on its own and their texts joined;
no text carries over from one window into the next (Whisper's long-form decoding conditions each window on the text
before it, which this engine does not do).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
CUT_FRAME = SAMPLE_RATE // 100  # 10 ms: the frames a cut between windows is placed among (the quietest)
PROCESSOR, PREPROCESSOR = "processor_config.json", "preprocessor_config.json"
NESTED = ("feature_extractor", "audio_processor")  # the keys transformers nests a processor's extractor under


class AudioError(ValueError):
    """Audio the engine cannot take; the message says why (and what it would take)."""


def read_wav(path: str | Path) -> np.ndarray:
    """A PCM WAV file as float32 samples in [-1, 1] at 16 kHz (``resample``d from its own rate), channels averaged.
    AudioError: no such file, one the OS will not read (a directory, no permission: its reason), or not a PCM WAV
    file."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (decode_wav's with closes it)
    except OSError as e:
        why = "no such file" if e.errno == errno.ENOENT else (e.strerror or str(e))
        raise AudioError(f"{path}: {why}") from None
    return decode_wav(f, str(path))


def decode_wav(f: BinaryIO, path: str) -> np.ndarray:
    """``read_wav`` of an open binary file (an upload's bytes in ``io.BytesIO``), named ``path`` in errors; closes
    it."""
    try:
        with f, wave.open(f, "rb") as w:
            rate, width, channels, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            raw = w.readframes(n)
    except OSError as e:
        raise AudioError(f"{path}: {e.strerror or e}") from None
    except (wave.Error, EOFError) as e:
        raise AudioError(f"{path}: not a PCM WAV file ({e})") from None
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        x = np.frombuffer(raw, np.int16 if width == 2 else np.int32).astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise AudioError(f"{path}: {8 * width}-bit samples; 8, 16 and 32-bit PCM are read")
    return resample(x.reshape(-1, channels).mean(axis=1), rate, SAMPLE_RATE)


def resample(x: np.ndarray, src: int, dst: int, zeros: int = 6, rolloff: float = 0.99) -> np.ndarray:
    """float32 samples at ``src`` Hz as ``dst`` Hz (unchanged when equal): each output sample the input under a
    Hann-windowed sinc low-pass at ``rolloff`` of the lower rate's Nyquist (``zeros`` zero crossings a side), evaluated
    at its position in the input; with up / down = dst / src in lowest terms, the up output phases are the rows of one
    strided convolution. ceil(len * dst / src) samples."""
    if src == dst:
        return x
    g = math.gcd(src, dst)
    up, down = dst // g, src // g
    fc = 0.5 * min(1.0, up / down) * rolloff  # the cutoff, cycles an input sample
    half = math.ceil(zeros / (2 * fc))  # the kernel's half width, input samples
    t = (np.arange(2 * half + down)[None, :] - half) - np.arange(up)[:, None] * (down / up)  # [up, K] from each
    w = 2 * fc * np.sinc(2 * fc * t) * np.where(np.abs(t) < half, np.cos(np.pi * t / (2 * half)) ** 2, 0.0)  # phase
    xp = torch.from_numpy(np.pad(np.asarray(x, np.float32), (half, half + down)))[None, None]  # [1, 1, L + K - down]
    y = torch.nn.functional.conv1d(xp, torch.from_numpy(w.astype(np.float32))[:, None], stride=down)  # [1, up, Q]
    n = -(-len(x) * up // down)
    return y[0].T.reshape(-1)[:n].numpy()


def _settings(path: Path) -> tuple[Path, dict] | None:
    """The feature extractor settings a checkpoint directory saves and the file holding them, in transformers' order:
    processor_config.json's nested extractor, else preprocessor_config.json; None where neither has them."""
    for name in (PROCESSOR, PREPROCESSOR):
        f = path / name
        if not f.exists():
            continue
        try:
            raw = json.loads(f.read_text())
        except OSError as e:
            raise AudioError(f"{f}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise AudioError(f"{f}: not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise AudioError(f"{f}: not a JSON object")
        if name == PREPROCESSOR:
            return f, raw
        nested = next((raw[k] for k in NESTED if isinstance(raw.get(k), dict)), None)
        if nested is not None:
            return f, nested
    return None


def feature_extractor(path: str | Path | None, num_mel_bins: int):
    """The checkpoint's feature extractor (processor_config.json's ``feature_extractor``, else
    preprocessor_config.json), or for ``path`` None Whisper's defaults for that many bins. A directory with neither
    file gets the defaults too, with a warning in the log: 16 kHz, n_fft 400, hop 160, 30 s chunks, the model's mel
    bins, which every released Whisper checkpoint uses. AudioError: a settings file that cannot be read, or one whose
    mel bins are not the model's."""
    from transformers import WhisperFeatureExtractor

    found = None if path is None else _settings(Path(path))
    if found is not None:
        source, settings = found
        try:
            fe = WhisperFeatureExtractor.from_dict(dict(settings))
        except (TypeError, ValueError) as e:
            raise AudioError(f"{source}: transformers' WhisperFeatureExtractor cannot take its settings: {e}") from None
    else:
        source = "Whisper's default feature extractor"
        fe = WhisperFeatureExtractor(feature_size=num_mel_bins)
        if path is not None:
            log.warning("%s: no %s or %s; using Whisper's feature extractor defaults (%d Hz, n_fft %d, hop %d, %d s "
                        "chunks, %d mel bins)", path, PROCESSOR, PREPROCESSOR, fe.sampling_rate, fe.n_fft,
                        fe.hop_length, fe.chunk_length, num_mel_bins)  # fmt: skip
    if fe.feature_size != num_mel_bins:
        raise AudioError(f"{source}: the feature extractor makes {fe.feature_size} mel bins, the model reads "
                         f"{num_mel_bins}")  # fmt: skip
    return fe


def windows(waveform: np.ndarray, window: int, search: int = SAMPLE_RATE) -> list[tuple[int, np.ndarray]]:
    """The waveform in consecutive pieces of at most ``window`` samples, joining back to it: each but the last cut in
    the middle of the quietest 10 ms frame (least energy) among the last ``search`` samples of its window (at most half
    a window), so that a cut falls in a pause where there is one. Returns (first sample, piece) each."""
    x = np.asarray(waveform, dtype=np.float32)
    search = min(search, window // 2)
    frames = search // CUT_FRAME
    out, start = [], 0
    while x.size - start > window:
        end = start + window
        if frames:
            lo = end - frames * CUT_FRAME
            energy = np.square(x[lo:end]).reshape(frames, CUT_FRAME).sum(1)  # [frames]
            cut = lo + int(np.argmin(energy)) * CUT_FRAME + CUT_FRAME // 2
        else:  # (a window under two frames: cut at its end)
            cut = end
        out.append((start, x[start:cut]))
        start = cut
    out.append((start, x[start:]))
    return out


def log_mel(waveform: np.ndarray, extractor, n_frames: int) -> torch.Tensor:
    """[n_mels, n_frames] float32 log-mel features of one 16 kHz waveform, padded to the encoder's window."""
    x = np.asarray(waveform, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise AudioError(f"a waveform is a non-empty 1-D array of samples, got shape {x.shape}")
    window = n_frames * extractor.hop_length
    if x.size > window:
        raise AudioError(f"{x.size / SAMPLE_RATE:.1f} s of audio; the encoder reads {window / SAMPLE_RATE:.1f} s at "
                         "once (``windows`` cuts longer audio)")  # fmt: skip
    out = extractor(x, sampling_rate=SAMPLE_RATE, return_tensors="pt", padding="max_length", max_length=window,
                    truncation=True)  # fmt: skip
    return out.input_features[0].float()


def languages(generation: dict) -> dict[int, str]:
    """A multilingual checkpoint's language tokens, id -> code ("en"), from ``generation_config.json``'s
    ``lang_to_id`` (empty for an English-only checkpoint: nothing to detect)."""
    return {int(i): k.strip("<|>") for k, i in (generation.get("lang_to_id") or {}).items()}


def previous_ids(tokenizer, text: str, context: int) -> list[int]:
    """The ids of a text a transcription is conditioned on (OpenAI's ``prompt``: earlier words, names' spellings):
    " " + the text, without special tokens, its last ``context // 2 - 1`` (as openai-whisper keeps them; none for a
    blank text). ``tokenizer``: models.engine.text.Tokenizer."""
    text = text.strip()
    return tokenizer.encode_many([" " + text], special=False)[0][-(context // 2 - 1):] if text else []


def detection_prompt(generation: dict, decoder_start: int) -> list[int]:
    """The decoder prompt whose next token is the spoken language (Whisper's language detection): the start token
    alone. Drawn with logprobs (``detected``), one token."""
    return [int(generation.get("decoder_start_token_id", decoder_start))]


def detected(top: Sequence[tuple[int, float]], langs: dict[int, str]) -> str | None:
    """The spoken language: the most likely language token among the alternatives of the token after the start
    token ((id, logprob) pairs, most likely first: a request's ``top_logprobs``), as its code; None when none of them
    is a language token (Whisper puts one first; a model that does not says nothing of the language)."""
    return next((langs[i] for i, _ in top if i in langs), None)


def decoder_prompt(generation: dict, decoder_start: int, language: str | None = "en", task: str = "transcribe",
                   timestamps: bool = False, previous: Sequence[int] = ()) -> list[int]:
    """Whisper's decoder prompt: the start token, then for a multilingual checkpoint its language and task tokens,
    then no-timestamps (unless ``timestamps``), from ``generation_config.json``; with ``previous`` (the ids of a text
    to condition on, ``previous_ids``) those after <|startofprev|>, before the start token."""
    if previous:
        prev = generation.get("prev_sot_token_id")
        if prev is None:
            raise AudioError("the checkpoint names no <|startofprev|> token (prev_sot_token_id in "
                             "generation_config.json): it takes no previous text")  # fmt: skip
        return [int(prev), *previous, *decoder_prompt(generation, decoder_start, language, task, timestamps)]
    out = detection_prompt(generation, decoder_start)
    langs, tasks = generation.get("lang_to_id") or {}, generation.get("task_to_id") or {}
    if langs:
        key = language if language is None or language.startswith("<|") else f"<|{language}|>"
        if key not in langs:
            raise AudioError(f"language {language!r} is not one of the checkpoint's "
                             f"({', '.join(sorted(k.strip('<|>') for k in langs)[:12])}, ...)")  # fmt: skip
        if task not in tasks:
            raise AudioError(f"task {task!r} is not one of the checkpoint's ({', '.join(sorted(tasks))})")
        out += [int(langs[key]), int(tasks[task])]
    elif task != "transcribe":
        raise AudioError(f"task {task!r}: an English-only checkpoint (no language tokens) only transcribes")
    no_ts = generation.get("no_timestamps_token_id")
    if no_ts is not None and not timestamps:
        out.append(int(no_ts))
    return out
