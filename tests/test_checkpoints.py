"""From a Hugging Face directory on disk to text (no downloads: tiny checkpoints saved by transformers here, a tiny
byte-level tokenizer trained here): ``Engine.from_pretrained`` serves Qwen3_5ForCausalLM, a sharded and tied
Qwen3_5ForConditionalGeneration and Whisper with transformers' greedy tokens and text; generation_config.json's EOS
stops requests unless they ignore it; malformed directories are refused naming the problem; streamed text never
splits a character; ``python -m models.generate`` serves a prompt, a file of prompts, a chat and a WAV file."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from checkpoints import save_qwen, save_whisper, tone, write_wav

from models.engine import Engine, EngineConfig, FinishReason, InvalidRequest, Request, SamplingParams
from models.engine.audio import AudioError, decoder_prompt, feature_extractor, log_mel, previous_ids, read_wav
from models.engine.checkpoint import CheckpointError, read_checkpoint
from models.engine.text import REPLACEMENT, Tokenizer, TokenizerError

transformers = pytest.importorskip("transformers")
CFG = EngineConfig(page_size=4, max_seq_len=96, max_running=4)
TEXTS = ["the resident planner keeps", "café 😀 jalapeño", "paged attention reads", "日本語のテキスト"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return dict(causal=save_qwen(root / "causal"), vl=save_qwen(root / "vl", conditional=True, tied=True,
                                                              shard="100KB"),
                whisper=save_whisper(root / "whisper"), root=root)  # fmt: skip


def _hf_greedy(model, ids: list[int], n: int, eos=None) -> tuple[int, ...]:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)  # fmt: skip
    new = out[0, len(ids) :].tolist()
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return tuple(new)


@pytest.mark.parametrize("kind", ["causal", "vl"])
def test_greedy_tokens_and_text_equal_transformers_generate(dirs, kind):
    """Qwen3_5ForCausalLM (one file, untied) and Qwen3_5ForConditionalGeneration (13 shards, tied lm_head absent from
    the files, vision tower skipped): the engine's greedy tokens are transformers' from the same directory, and the
    text streamed token by token is the tokenizer's decoding of them."""
    path = dirs[kind]
    cls = transformers.Qwen3_5ForConditionalGeneration if kind == "vl" else transformers.AutoModelForCausalLM
    hf = cls.from_pretrained(path).eval()
    tok = Tokenizer.from_pretrained(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    engine = Engine.from_pretrained(path, CFG)
    assert engine.adapter.checkpoint.architecture == hf.config.architectures[0]
    prompts = [tok.encode(t) for t in TEXTS]
    assert prompts == [hf_tok(t)["input_ids"] for t in TEXTS]
    got = engine.run([Request(p, SamplingParams(max_tokens=12)) for p in prompts])
    for p, r in zip(prompts, got, strict=True):
        assert r.tokens == _hf_greedy(hf, p, 12)
        stream = tok.detokenizer()
        pieces = [stream.push(t) for t in r.tokens] + [stream.flush()]
        assert "".join(pieces) == hf_tok.decode(list(r.tokens), skip_special_tokens=True)


def test_generation_configs_eos_stops_requests_unless_they_ignore_it(dirs):
    """An EOS token the model does produce (its fourth new token for this prompt): the engine stops there, as
    transformers' generate does with the same generation_config.json; ignore_eos runs to max_tokens."""
    src = dirs["causal"]
    prompt = Tokenizer.from_pretrained(src).encode(TEXTS[0])
    free = Engine.from_pretrained(src, CFG).run([Request(prompt, SamplingParams(max_tokens=12))])[0].tokens
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    path = dirs["root"] / "causal-eos"
    shutil.copytree(src, path)
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [free[k], 319]}))
    engine = Engine.from_pretrained(path, CFG)
    assert engine.adapter.eos_token_ids == (free[k], 319)
    stopped, ignored = engine.run([Request(prompt, SamplingParams(max_tokens=12)),
                                   Request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))])  # fmt: skip
    assert stopped.tokens == free[: k + 1] and stopped.finish_reason is FinishReason.STOP
    assert ignored.tokens == free and ignored.finish_reason is FinishReason.LENGTH
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    assert stopped.tokens == _hf_greedy(hf, prompt, 12, eos=free[k])


def test_whisper_transcribes_a_wav_file_as_transformers_does(dirs):
    """A 0.48 s tone as a 16-bit WAV: log-mel features from the checkpoint's feature extractor, the decoder prompt
    (start, English, transcribe, no timestamps) from its generation config; greedy tokens equal transformers'
    generate from the same directory, told the language and task."""
    path = dirs["whisper"]
    wav = write_wav(dirs["root"] / "tone.wav", tone(0.48))
    ckpt = read_checkpoint(path)
    cfg = ckpt.config
    features = log_mel(read_wav(wav), feature_extractor(path, cfg.num_mel_bins), cfg.n_frames)
    assert tuple(features.shape) == (16, 48)
    prompt = decoder_prompt(ckpt.generation, cfg.decoder_start_token_id, "en", "transcribe")
    assert prompt == [1, 2, 5, 6]  # <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>
    engine = Engine.from_pretrained(path, EngineConfig(page_size=4, max_seq_len=24, max_running=2))
    got = engine.run([Request(prompt, SamplingParams(max_tokens=10, ignore_eos=True), features=features)])[0]
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(path).eval()
    ref = hf.generate(input_features=features[None], language="en", task="transcribe", max_new_tokens=10,
                      do_sample=False, eos_token_id=None, suppress_tokens=None, begin_suppress_tokens=None)
    assert got.tokens == tuple(ref[0].tolist()) and len(set(got.tokens)) > 2  # (generate builds its own prompt)
    with pytest.raises(InvalidRequest, match="holds its start token 1"):
        engine.submit(Request([2, 5], features=features))


def test_whisper_conditioned_on_a_previous_text_decodes_as_transformers_does(dirs):
    """OpenAI's transcription ``prompt``: " " + the text's ids after <|startofprev|>, before the start token
    (``previous_ids``, ``decoder_prompt(previous=)``); greedy tokens equal transformers' generate given the same
    ``prompt_ids``, and differ from the unconditioned ones. A text longer than half the context keeps its last ids."""
    path = dirs["whisper"]
    ckpt, tok = read_checkpoint(path), Tokenizer.from_pretrained(path)
    cfg, prev_sot = ckpt.config, ckpt.generation["prev_sot_token_id"]
    features = log_mel(read_wav(write_wav(dirs["root"] / "tone.wav", tone(0.48))),
                       feature_extractor(path, cfg.num_mel_bins), cfg.n_frames)  # fmt: skip
    previous = previous_ids(tok, "  w7 w9 w12 ", cfg.max_target_positions)
    assert previous == tok.encode_many([" w7 w9 w12"], special=False)[0] and 0 < len(previous) < 31
    prompt = decoder_prompt(ckpt.generation, cfg.decoder_start_token_id, "en", "transcribe", previous=previous)
    assert prompt == [prev_sot, *previous, 1, 2, 5, 6]
    engine = Engine.from_pretrained(path, EngineConfig(page_size=4, max_seq_len=32, max_running=2))
    plain, got = engine.run([Request(p, SamplingParams(max_tokens=10, ignore_eos=True), features=features)
                             for p in (prompt[len(previous) + 1:], prompt)])  # fmt: skip
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(path).eval()
    ref = hf.generate(input_features=features[None], language="en", task="transcribe", max_new_tokens=10,
                      prompt_ids=torch.tensor([prev_sot, *previous]), do_sample=False, eos_token_id=None,
                      suppress_tokens=None, begin_suppress_tokens=None)  # fmt: skip
    assert got.tokens == tuple(ref[0].tolist()) != plain.tokens
    long = previous_ids(tok, " ".join(f"w{i}" for i in range(10, 60)), cfg.max_target_positions)
    assert long == tok.encode_many([" " + " ".join(f"w{i}" for i in range(10, 60))], special=False)[0][-31:]
    assert previous_ids(tok, "   ", cfg.max_target_positions) == []
    with pytest.raises(AudioError, match="no <\\|startofprev\\|> token"):
        decoder_prompt({k: v for k, v in ckpt.generation.items() if k != "prev_sot_token_id"},
                       cfg.decoder_start_token_id, previous=previous)  # fmt: skip


MALFORMED = {  # name: (how to break a copy of the causal directory, words of the error)
    "no-config": (lambda p: (p / "config.json").unlink(), "config.json: No such file"),
    "bad-json": (lambda p: (p / "config.json").write_text("{"), "config.json: not JSON"),
    "unknown-architecture": (lambda p: _edit(p, architectures=["LlamaForCausalLM"]),
                             "architectures ['LlamaForCausalLM']: this engine serves"),
    "unsupported-activation": (lambda p: _edit(p, hidden_act="gelu"), "hidden_act is 'gelu'"),
    "a-width-as-text": (lambda p: _edit(p, hidden_size="64"), "hidden_size is '64', not an integer"),
    "unknown-dtype": (lambda p: _edit(p, dtype="float99"), "dtype 'float99' is not a torch dtype"),
    "no-weights": (lambda p: (p / "model.safetensors").unlink(), "no model.safetensors and no"),
    "missing-weight": (lambda p: _drop(p, "model.norm.weight"), "missing weight 'model.norm.weight'"),
    "unexpected-weight": (lambda p: _add(p, "model.extra.weight", torch.zeros(2)), "unexpected weight 'model.extra"),
    "misshapen-weight": (lambda p: _add(p, "model.norm.weight", torch.zeros(3)), "'model.norm.weight' has shape (3,)"),
    "missing-shard": (lambda p: _index(p, "model-00009-of-00009.safetensors"), "which is not in"),
    "truncated-weights": (lambda p: _truncate(p / "model.safetensors"),
                          "model.safetensors: not a valid safetensors file (truncated or corrupted?)"),
    "garbage-weights": (lambda p: (p / "model.safetensors").write_bytes(bytes(range(256)) * 8),
                        "model.safetensors: not a valid safetensors file"),
    "truncated-shard": (lambda p: (_index(p, "model.safetensors"), _truncate(p / "model.safetensors")),
                        "model.safetensors: not a valid safetensors file"),
    "shard-without-its-weight": (lambda p: (_index(p, "model.safetensors"), _drop(p, "model.norm.weight")),
                                 "model.safetensors: no weight 'model.norm.weight', which model.safetensors.index"),
}  # fmt: skip


def _edit(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **changes}))


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _drop(path, name):
    from safetensors.torch import save_file

    t = _tensors(path)
    del t[name]
    save_file(t, path / "model.safetensors")


def _add(path, name, value):
    from safetensors.torch import save_file

    t = _tensors(path)
    t[name] = value
    save_file(t, path / "model.safetensors")


def _truncate(f):
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def _index(path, shard):
    names = list(_tensors(path))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))


def _hf_config(path):
    """Our config of a directory the way read_checkpoint made it before config_json: through transformers'
    AutoConfig (the reference config_json's defaults and rules are held against)."""
    from models.qwen3_5.config import Qwen35Config
    from models.whisper.config import WhisperConfig

    hf = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if hf.model_type == "whisper":
        return WhisperConfig.from_hf(hf)
    if hf.model_type == "qwen3_5":
        return Qwen35Config.from_hf(hf.text_config, path.name, tie_word_embeddings=hf.tie_word_embeddings)
    return Qwen35Config.from_hf(hf, path.name)


def _without(raw: dict, names) -> dict:
    return {k: v for k, v in raw.items() if k not in names}


def _qwen_variants(raw: dict) -> dict:
    """Text configs as other writers leave them, each read alike by transformers: every field the engine reads left
    out but the shape's own; rope's fields at the top level; layer types left to the interval; legacy layer names."""
    from models.engine.config_json import QWEN_TEXT

    shape = {"vocab_size", "hidden_size", "num_hidden_layers", "head_dim"}
    rope = raw["rope_parameters"]
    return {
        "as-saved": raw,
        "defaults": _without(raw, (set(QWEN_TEXT) | {"layer_types", "rope_parameters", "partial_rotary_factor"})
                             - shape),
        "rope-at-top": {**_without(raw, {"rope_parameters"}), "rope_theta": 5e5, "partial_rotary_factor": 0.5},
        "rope-no-factor": {**_without(raw, {"partial_rotary_factor"}),
                           "rope_parameters": _without(rope, {"partial_rotary_factor"})},
        "interval": {**_without(raw, {"layer_types"}), "full_attention_interval": 2},
        "legacy-names": {**raw, "layer_types": ["mamba", "attention", "mamba", "attention"]},
        "torch-dtype": {**_without(raw, {"dtype"}), "torch_dtype": "bfloat16"},
    }  # fmt: skip


def test_config_json_reads_a_config_as_transformers_does(dirs):
    """read_checkpoint (which no longer imports transformers) gives the config and dtype transformers' AutoConfig
    gave, over the variants real config.json files take, for the causal, the conditional and the Whisper model."""
    cases = []
    causal = json.loads((dirs["causal"] / "config.json").read_text())
    for name, raw in _qwen_variants(causal).items():
        cases.append((f"causal-{name}", raw))
    vl = json.loads((dirs["vl"] / "config.json").read_text())
    for name, text in _qwen_variants(vl["text_config"]).items():
        cases.append((f"vl-{name}", {**vl, "text_config": text}))
    cases.append(("vl-untied-by-default", _without(vl, {"tie_word_embeddings"})))
    whisper = json.loads((dirs["whisper"] / "config.json").read_text())
    from models.engine.config_json import WHISPER

    cases += [("whisper", whisper), ("whisper-defaults", _without(whisper, set(WHISPER))),
              ("whisper-aliases", {**_without(whisper, {"d_model", "encoder_layers"}), "hidden_size": 32,
                                   "num_hidden_layers": 3})]  # fmt: skip
    for name, raw in cases:
        path = dirs["root"] / f"config-{name}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps(raw))
        ours = read_checkpoint(path)
        hf = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        declared = getattr(hf, "dtype", None) or getattr(getattr(hf, "text_config", None), "dtype", None)
        assert ours.config == _hf_config(path), name
        assert ours.dtype == (declared or torch.float32), name


def test_config_json_defaults_are_transformers_config_classes_defaults():
    from models.engine import config_json

    text, whisper = transformers.Qwen3_5TextConfig(), transformers.WhisperConfig()
    for table, hf in ((config_json.QWEN_TEXT, text), (config_json.WHISPER, whisper)):
        for name, default in table.items():
            theirs = getattr(hf, name)
            assert (list(theirs) if isinstance(theirs, tuple) else theirs) == (
                list(default) if isinstance(default, tuple) else default), name
    assert transformers.Qwen3_5Config().tie_word_embeddings == config_json.QWEN_VL_TIED
    assert text.rope_parameters["rope_theta"] == config_json.ROPE_THETA
    assert text.rope_parameters["partial_rotary_factor"] == config_json.PARTIAL_ROTARY_FACTOR
    assert config_json.qwen_text({}).layer_types == text.layer_types


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_a_malformed_directory_is_refused_naming_the_problem(dirs, case):
    path = dirs["root"] / f"bad-{case}"
    shutil.copytree(dirs["causal"], path)
    breaks, words = MALFORMED[case]
    breaks(path)
    with pytest.raises(CheckpointError) as info:
        Engine.from_pretrained(path, CFG)
    assert words in str(info.value)


def test_streamed_text_never_splits_a_character(dirs):
    """Multi-byte characters spread over byte-level tokens: every piece is whole text (no U+FFFD), and the pieces
    join to the decoding of all the tokens."""
    tok = Tokenizer.from_pretrained(dirs["causal"])
    for text in TEXTS + ["😀🚀 naïve 日本"]:
        ids = tok.encode(text)
        assert any(REPLACEMENT in tok.decode([i]) for i in ids) or text.isascii()  # the split really happens
        stream = tok.detokenizer()
        pieces = [stream.push(i) for i in ids]
        assert all(REPLACEMENT not in p for p in pieces)
        assert "".join(pieces) + stream.flush() == tok.decode(ids) == text
        for cut in range(1, len(ids) + 1):  # a reply that ends anywhere, an incomplete character's bytes included
            stream = tok.detokenizer()
            pieces = [stream.push(i) for i in ids[:cut]]
            assert "".join(pieces) + stream.flush() == tok.decode(ids[:cut])


def test_chat_messages_go_through_the_chat_template(dirs):
    tok = Tokenizer.from_pretrained(dirs["causal"])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "café?"}]
    ids = tok.chat(messages)
    assert tok.hf.decode(ids) == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\ncafé?<|im_end|>\n" \
                                 "<|im_start|>assistant\n"  # fmt: skip
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_pretrained(dirs["whisper"]).chat(messages)
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_pretrained(dirs["root"])


def test_a_batch_of_texts_encodes_as_each_alone_and_a_chat_as_transformers_template_does(dirs):
    """``encode_many`` (one call for many texts: what the server's tokenizer queue sends) gives each text the ids
    ``encode`` gives it alone, special tokens included (Whisper's tokenizer adds some); ``chat`` gives what
    transformers' ``apply_chat_template`` tokenizes."""
    from tokenizers.processors import TemplateProcessing

    texts = [*TEXTS, "😀🚀 naïve 日本", "", " x"]
    for name in ("causal", "whisper"):
        tok = Tokenizer.from_pretrained(dirs[name])
        assert tok.encode_many(texts) == [tok.encode(t) for t in texts]
    bos = Tokenizer.from_pretrained(dirs["causal"])  # a tokenizer that adds a special token before every text
    start = bos.hf.convert_tokens_to_ids("<|im_start|>")
    bos.hf.backend_tokenizer.post_processor = TemplateProcessing(single="<|im_start|> $A",
                                                                 special_tokens=[("<|im_start|>", start)])  # fmt: skip
    assert bos.encode_many(texts) == [bos.encode(t) for t in texts] and bos.encode("a")[0] == start
    assert [[start, *ids] for ids in bos.encode_many(texts, special=False)] == bos.encode_many(texts)
    tok = Tokenizer.from_pretrained(dirs["causal"])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "café? 😀"}]
    want = tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert tok.chat(messages) == list(want["input_ids"] if hasattr(want, "keys") else want)


def test_audio_the_engine_cannot_take_is_refused(dirs):
    path = dirs["whisper"]
    fe = feature_extractor(path, 16)
    with pytest.raises(AudioError, match="the encoder reads 0.5 s at once"):
        log_mel(tone(1.0), fe, 48)
    with pytest.raises(AudioError, match="not a PCM WAV"):
        read_wav(dirs["whisper"] / "config.json")
    with pytest.raises(AudioError, match=r"nowhere.wav: no such file$"):
        read_wav(dirs["root"] / "nowhere.wav")
    with pytest.raises(AudioError, match=r"whisper: Is a directory$"):  # the OS's reason, not "not a PCM WAV"
        read_wav(dirs["whisper"])
    ckpt = read_checkpoint(path)
    with pytest.raises(AudioError, match="language 'fr' is not one of the checkpoint's"):
        decoder_prompt(ckpt.generation, 1, "fr")
    assert decoder_prompt(ckpt.generation, 1, "de", "translate", timestamps=True) == [1, 3, 4]


def test_the_feature_extractor_comes_from_processor_config_json_or_the_defaults_with_a_warning(dirs, caplog):
    """transformers 5 saves a WhisperProcessor's extractor settings nested in processor_config.json: they are read (a
    hop of 80 here, not the default 160); a directory with neither settings file gets Whisper's defaults, saying so."""
    path = dirs["root"] / "whisper-processor"
    shutil.copytree(dirs["whisper"], path)
    (path / "preprocessor_config.json").unlink()
    fe = transformers.WhisperFeatureExtractor(feature_size=16, hop_length=80)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    transformers.WhisperProcessor(feature_extractor=fe, tokenizer=tok).save_pretrained(path)
    assert (path / "processor_config.json").exists() and not (path / "preprocessor_config.json").exists()
    assert feature_extractor(path, 16).hop_length == 80
    with pytest.raises(AudioError, match="processor_config.json: the feature extractor makes 16 mel bins"):
        feature_extractor(path, 80)
    (path / "processor_config.json").unlink()
    with caplog.at_level(logging.WARNING, logger="models.engine.audio"):
        assert feature_extractor(path, 16).hop_length == 160
    assert "no processor_config.json or preprocessor_config.json; using Whisper's feature extractor defaults (16000 " \
           "Hz, n_fft 400, hop 160, 30 s chunks, 16 mel bins)" in caplog.text  # fmt: skip


# -- python -m models.generate ---------------------------------------------------------------------------------------
def _generate(capsys, *args) -> tuple[str, str]:
    from models.generate import main

    assert main([str(a) for a in args]) == 0
    out = capsys.readouterr()
    return out.out, out.err


@pytest.mark.parametrize("engine_args", [[], ["--overlap", "--prefill-graphs", "2", "--no-prefix-cache"]],
                         ids=["default", "fast-path"])  # fmt: skip
def test_generate_streams_a_prompts_text(dirs, capsys, engine_args):
    path = dirs["causal"]
    out, err = _generate(capsys, "--model-dir", path, "--prompt", TEXTS[1], "--max-tokens", "10", "--ignore-eos",
                         *engine_args)  # fmt: skip
    tok = Tokenizer.from_pretrained(path)
    want = Engine.from_pretrained(path, CFG).run([Request(tok.encode(TEXTS[1]),
                                                          SamplingParams(max_tokens=10, ignore_eos=True))])[0]
    assert out == tok.decode(want.tokens) + "\n"  # stdout: the text alone
    assert "length, 10 tokens" in err
    stages = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[") and line.endswith(" ...")]
    assert stages == [f"loading {path} ...", "building the engine (graphs, kernels) ...", "generating (1 request) ..."]
    assert ("prefix cache on" in err) == ("--no-prefix-cache" not in engine_args)  # (Qwen3.5's default: on)


def test_generate_runs_a_file_of_prompts_and_a_chat(dirs, capsys, tmp_path):
    path = dirs["causal"]
    f = tmp_path / "prompts.txt"
    f.write_text(f"{TEXTS[0]}\n\n{TEXTS[2]}\n")
    out, err = _generate(capsys, "--model-dir", path, "-n", f, "--max-tokens", "6", "--chat", "--system", "be brief",
                         "--temperature", "0.8", "--seed", "3", "--quiet")  # fmt: skip
    assert out.count("### [") == 2 and "### [0]" in out and "### [1]" in out
    assert err == ""  # --quiet: no progress, no summary


@pytest.mark.parametrize("src", [8000, 22050, 44100, 48000])
def test_audio_at_another_rate_is_resampled_to_16_khz(dirs, src):
    """A 1 kHz and a 5 kHz sine at ``src`` Hz come out as the same sines sampled at 16 kHz (within 0.5% of the
    amplitude, past the filter's edges), ceil(n * 16000 / src) samples; a 12 kHz one (above the 8 kHz the output holds)
    is filtered out, not folded to 4 kHz (under 1% of its RMS); a WAV file at that rate reads as its resampled
    samples."""
    import numpy as np

    from models.engine.audio import resample

    n = src // 2
    at = lambda f, rate, k: np.sin(2 * np.pi * f * np.arange(k) / rate).astype(np.float32)  # noqa: E731
    for f in (1000.0, 5000.0, 12000.0):
        y = resample(at(f, src, n), src, 16000)
        assert y.dtype == np.float32 and y.size == -(-n * 16000 // src)
        inner = slice(40, -40)
        if f < min(src, 16000) / 2 * 0.8:
            assert np.abs(y[inner] - at(f, 16000, y.size)[inner]).max() < 5e-3, f
        elif f > 8000 and src > 24000:
            assert np.sqrt(np.mean(y[inner] ** 2)) < 0.01 * np.sqrt(0.5), f
    x = tone(0.25)
    assert resample(x, 16000, 16000) is x
    wav = write_wav(dirs["root"] / f"at_{src}.wav", resample(x, 16000, src), rate=src)
    assert np.abs(read_wav(wav) - resample(np.round(resample(x, 16000, src).clip(-1, 1) * 32767) / 32768, src,
                                           16000)).max() < 1e-4  # fmt: skip


def test_the_spoken_language_is_the_most_likely_language_token_after_the_start_token():
    from models.engine.audio import detected, detection_prompt, languages

    gen = {"decoder_start_token_id": 7, "lang_to_id": {"<|en|>": 2, "<|de|>": 3}}
    assert languages(gen) == {2: "en", 3: "de"} and languages({}) == {} and detection_prompt(gen, 1) == [7]
    assert detected(((40, -0.1), (3, -2.0), (2, -2.5)), languages(gen)) == "de"  # the first language among them
    assert detected(((40, -0.1), (41, -2.0)), languages(gen)) is None
    assert decoder_prompt({}, 1, None, "transcribe") == [1]  # English-only: the start token (and no-timestamps)
    with pytest.raises(AudioError, match="an English-only checkpoint .* only transcribes"):
        decoder_prompt({}, 1, None, "translate")


def test_windows_cut_audio_in_its_pauses_and_join_back_to_it():
    """Pieces of at most a window, joining to the waveform; each cut in the middle of the quietest 10 ms of its window's
    last second (at most half a window): a 40 ms pause there takes it, and without pauses the cuts still fit."""
    import numpy as np

    from models.engine.audio import CUT_FRAME, SAMPLE_RATE, windows

    rng = np.random.default_rng(0)
    speech = lambda s: (0.3 * rng.standard_normal(int(s * SAMPLE_RATE))).astype(np.float32)  # noqa: E731
    gap = np.zeros(640, np.float32)  # 40 ms
    x = np.concatenate([speech(29.5), gap, speech(29.3), gap, speech(20.0)])  # pauses at 29.50 and 58.84 s
    window = 30 * SAMPLE_RATE
    pieces = windows(x, window)
    assert np.array_equal(np.concatenate([p for _, p in pieces]), x)
    assert [a for a, _ in pieces] == [0, *np.cumsum([p.size for _, p in pieces])[:-1].tolist()]
    assert all(p.size <= window for _, p in pieces) and len(pieces) == 3
    for (a, p), pause in zip(pieces, (29.5, 29.5 + 0.04 + 29.3), strict=False):  # each cut inside its pause
        assert pause * SAMPLE_RATE < a + p.size < pause * SAMPLE_RATE + 640, (a + p.size) / SAMPLE_RATE
    steady = windows(speech(95.0), window)  # no pause: cut where the noise is least, within the last second
    assert len(steady) == 4 and all(window - SAMPLE_RATE < p.size <= window for _, p in steady[:-1])
    assert [p.size for _, p in windows(x[:window], window)] == [window]  # one window: not cut
    assert all(p.size <= 48 * 160 for _, p in windows(speech(1.0), 48 * 160))  # (a tiny window: half of it searched)
    assert CUT_FRAME == 160


def test_generate_transcribes_a_wav_file(dirs, capsys):
    wav = write_wav(dirs["root"] / "speech.wav", tone(0.3, 300.0))
    out, err = _generate(capsys, "--model-dir", dirs["whisper"], "--audio", wav, "--max-tokens", "8")
    assert out.endswith("\n") and "tokens" in err


@pytest.mark.parametrize("args, words", [
    (["--prompt", "hi", "--audio", "x.wav"], "give one of --prompt, --prompts-file (-n) or --audio"),
    (["--audio", "x.wav"], "is a text model"),
    (["--prompt", "hi", "--max-tokens", "600"], "are more than causal's context of 512"),
    (["--prompt", "hi", "--top-k", "999"], "argument --top-k: must be in [0, 256]"),
    (["--prompt", "hi", "--prefill-graphs", "-1"], "argument --prefill-graphs: must be >= 0"),
    (["--prompt", "hi", "--language", "de"], "argument --language: causal is a text model (Qwen3_5ForCausalLM)"),
    (["--prompt", "hi", "--task", "translate"], "argument --task: causal is a text model"),
    (["--prompt", "hi", "--timestamps"], "argument --timestamps: causal is a text model"),
    (["--prompt", "hi", "--previous-text", "earlier"], "argument --previous-text: causal is a text model"),
    *([(["--prompt", "hi", "--attention", "fa2"], "attention fa2 runs on CUDA only; on cpu use torch or triton")]
      if not torch.cuda.is_available() else []),
])  # fmt: skip
def test_generate_refuses_in_one_line(dirs, capsys, args, words):
    from models.generate import main

    with pytest.raises(SystemExit) as info:
        main(["--model-dir", str(dirs["causal"]), *args, "--quiet"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err
    with pytest.raises(SystemExit):
        main(["--model-dir", str(dirs["root"] / "nowhere"), "--prompt", "hi"])
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    (["--audio", "nowhere.wav"], "nowhere.wav: no such file"),
    (["--audio", "speech.wav", "--chat"], "argument --chat: whisper is a Whisper checkpoint"),
])  # fmt: skip
def test_generate_refuses_in_one_line_for_whisper(dirs, capsys, args, words):
    from models.generate import main

    write_wav(dirs["root"] / "speech.wav", tone(0.3, 300.0))
    args = [str(dirs["root"] / a) if a.endswith(".wav") else a for a in args]
    with pytest.raises(SystemExit) as info:
        main(["--model-dir", str(dirs["whisper"]), *args, "--quiet"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err


def test_ctrl_c_ends_generate_quietly(dirs, capsys, monkeypatch):
    """Ctrl-C in the third step: the streamed line is ended, stderr's last line says so, exit status 130."""
    from models.engine import Engine as engine_class
    from models.generate import main

    step, steps = engine_class.step, []

    def interrupted_step(self):
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(engine_class, "step", interrupted_step)
    try:
        code = main(["--model-dir", str(dirs["causal"]), "--prompt", TEXTS[0], "--ignore-eos"])
    except KeyboardInterrupt:  # (would end the test session)
        pytest.fail("KeyboardInterrupt escaped main")
    assert code == 130 and len(steps) == 3
    out = capsys.readouterr()
    assert out.err.endswith("generating (1 request) ...\ninterrupted\n") and "Traceback" not in out.err, out.err
    assert out.out.endswith("\n") and out.out.count("\n") == 1, out.out


def test_the_default_config_fits_a_model_whose_context_is_short(dirs):
    """EngineConfig's context defaults to the model's where that is shorter than DEFAULT_CONTEXT (the tiny Whisper's
    decoder holds 64 tokens), and to DEFAULT_CONTEXT where it is longer."""
    from models.engine.config import DEFAULT_CONTEXT

    whisper = Engine.from_pretrained(dirs["whisper"])
    assert whisper.config.max_seq_len == whisper.adapter.max_context == 64
    assert Engine.from_pretrained(dirs["causal"]).config.max_seq_len == DEFAULT_CONTEXT
