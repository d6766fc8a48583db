"""Every command-line entry point says what it is (``python -m models.X`` in its usage line), explains every option,
and answers a bad argument or a missing GPU with one line naming the problem, never a traceback."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from kernels.runtime import interpreted

CLIS = ["models.demo", "models.generate", "models.server", *(f"models.bench.{m}" for m in (
    "attention", "decode_profile", "gemv", "planner", "prefill_profile", "prefill_ops", "serve", "traffic",
    "pool_probe", "prefill_pass", "prefill_kernels", "sampler", "step_profile", "make_checkpoint",
    "front_end", "host_step", "serve_http"))]  # fmt: skip


@pytest.mark.parametrize("module", CLIS)
def test_usage_names_the_module_and_every_option_has_help(module):
    ap = importlib.import_module(module).parser()
    assert ap.prog == f"python -m {module}"
    bare = [a.option_strings or a.dest for a in ap._actions if not a.help]
    assert not bare, f"options without help: {bare}"
    assert ap.format_help().startswith(f"usage: python -m {module}")


DEMO_ERRORS = [
    (["--seed", "-1"], "argument --seed: must be in [0, 2^31)"),
    (["-c", "0"], "argument -c/--concurrency: must be >= 1"),
    (["--num-pages", "4"], "3 usable pages cannot hold one request of 128 tokens"),
    (["--max-bucket", "9"], "max_bucket 9 is more than max_running 4"),
    (["--gen-len", "200"], "24 tokens and 200 new ones do not fit a context of 128"),
    (["--max-seq-len", "99999"], "99999 is longer than qwen3_5-tiny's context of 4096"),
    (["--top-k", "300"], "top_k: must be an integer in [0, 256]"),
    (["--model", "whisper-test", "--prompt-len", "4:8", "--gen-len", "8", "--attention", "triton"],
     "GPU attention backends serve one appended pool, no read pools" if interpreted() else "TRITON_INTERPRET=1"),
]  # fmt: skip


@pytest.mark.parametrize("args, words", DEMO_ERRORS, ids=[" ".join(a) for a, _ in DEMO_ERRORS])
def test_the_demo_refuses_in_one_line(args, words, capsys):
    from models.demo import main

    with pytest.raises(SystemExit) as info:
        main([*args, "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("cpus, words", [("0-", "is not a CPU list"), ("99999", "may run on CPUs")])
def test_serve_http_takes_cpu_lists_as_taskset_writes_them_and_refuses_others_in_one_line(cpus, words, capsys):
    from models.bench.serve_http import cpu_set, parser

    first = min(os.sched_getaffinity(0))
    assert cpu_set(f"{first}-{first},{first}") == {first}
    with pytest.raises(SystemExit):
        parser().parse_args(["--model-dir", "d", "--out", "o", "--client-cpus", cpus])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("ms, words", [("-1", "must be in [0, 1000], got -1"), ("soon", "is not a number")])
def test_serve_http_refuses_a_bad_burst_wait_at_parsing_in_one_line(ms, words, capsys):
    from models.bench.serve_http import parser

    assert parser().parse_args(["--model-dir", "d", "--out", "o", "--burst-wait-ms", "2.5"]).burst_wait_ms == 2.5
    with pytest.raises(SystemExit):
        parser().parse_args(["--model-dir", "d", "--out", "o", "--burst-wait-ms", ms])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--burst-wait-ms" in err and words in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without a GPU")
@pytest.mark.parametrize("module", ["attention", "decode_profile", "gemv", "prefill_profile", "serve", "prefill_pass",
                                    "prefill_kernels", "sampler", "step_profile"])
def test_a_gpu_benchmark_on_a_cpu_says_so_in_one_line(module, capsys, tmp_path):
    mod = importlib.import_module(f"models.bench.{module}")
    with pytest.raises(SystemExit) as info:
        mod.main(["--out", str(tmp_path)] if module == "serve" else [])
    text = str(info.value.code) + capsys.readouterr().err
    assert "GPU" in text and "Traceback" not in text


def test_the_demo_serves_whisper_with_its_default_lengths(capsys):
    """whisper-test's context is 64 tokens: the default new-token range is cut to fit beside the longest prompt (24),
    as the README's ``--model whisper-test`` promises; a range given by hand is refused instead (DEMO_ERRORS)."""
    from models.demo import main

    assert main(["--model", "whisper-test", "-n", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "16-40 new tokens" in out and "same tokens in resident and host: 4/4 requests" in out, out


GENERATE_ERRORS = [  # refused from the arguments alone, before anything is loaded (the model directory is not read)
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number >= 0"),
    (["--top-p", "1.5"], "argument --top-p: must be in (0, 1]"),
    (["--top-p", "0"], "argument --top-p: must be in (0, 1]"),
    (["--top-k", "1000"], "argument --top-k: must be in [0, 256]"),
    (["--seed", str(2**31)], "argument --seed: must be an int32"),
    (["--seed", "x"], "argument --seed: 'x' is not an integer"),
    (["--system", "be brief"], "argument --system: only with --chat"),
    (["--device", "tpu"], "argument --device: 'tpu': cuda, cuda:N or cpu"),
    *([(["--device", "cuda"], "argument --device: cuda: no CUDA GPU here")] if not torch.cuda.is_available() else []),
]  # fmt: skip


@pytest.mark.parametrize("args, words", GENERATE_ERRORS, ids=[" ".join(a) for a, _ in GENERATE_ERRORS])
def test_generate_refuses_a_bad_argument_before_loading(args, words, capsys, tmp_path):
    from models.generate import main

    with pytest.raises(SystemExit) as info:
        main(["--model-dir", str(tmp_path / "nowhere"), "--prompt", "hi", *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err  # (no "loading" line before it)


def test_a_cuda_only_attention_on_the_cpu_names_the_values_a_user_types():
    from models.engine import EngineConfig
    from models.layers.decode_attention import Backend

    with pytest.raises(ValueError) as info:
        EngineConfig(device="cpu", attention=Backend.FA2)
    assert "attention fa2 runs on CUDA only; on cpu use torch or triton (Backend.TORCH / Backend.TRITON)" in str(
        info.value)  # fmt: skip
