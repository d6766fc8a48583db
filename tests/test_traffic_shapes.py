"""Traffic that repeats itself (models/bench/traffic.py ``--shape``, models/bench/workload.py): a system prompt every
request shares exactly, chats whose every turn's prompt is the whole history (the tokens the engine returned) sent in
a closed loop, a trace's prefix and session fields and their errors, and the options in ``--help``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.bench import traffic
from models.bench.workload import WorkloadError, load_trace, read_trace
from models.engine import Engine
from models.engine.adapters import build_adapter

CPU = ["--model", "qwen3_5-tiny", "--device", "cpu", "--page-size", "4", "--max-running", "4", "--no-progress"]
VOCAB = 1000


def drawn(*argv: str) -> traffic.Traffic:
    args = traffic.parser().parse_args([*CPU, *argv, "--out", "x"])
    return traffic.draw_traffic(args, args.max_running)


def test_the_default_shape_is_independent_prompts():
    args = traffic.parser().parse_args(["--out", "x"])
    assert args.shape == "independent"
    w = drawn("--num-requests", "5").rounds[0]
    assert (w.prefix_id == -1).all() and (w.after == -1).all() and not w.chats and w.shape == ""
    assert (w.prompt_bound == w.prompt_len).all()


def test_a_system_prompt_is_shared_exactly_by_every_prompt_and_drawn_per_round():
    t = drawn("--shape", "system-prompt", "--system-len", "24", "--num-requests", "6", "--prompt-len",
              "uniform:3,9", "--rounds", "2")  # fmt: skip
    assert "a system prompt of 24 tokens shared by every request" in t.description
    firsts = []
    for rnd, w in enumerate(t.rounds):
        reqs = w.requests(VOCAB, t.sampling, rnd, f"{rnd}-")
        system = reqs[0].prompt[:24]
        for r, n in zip(reqs, w.prompt_len, strict=True):
            assert len(r.prompt) == 24 + n and r.prompt[:24] == system
        assert len({r.prompt[24:] for r in reqs}) == 6  # each its own part after it
        assert len({r.prompt[:25] for r in reqs}) > 1  # exactly the prefix, no more, is shared
        firsts.append(system)
        assert (w.prompt_bound == 24 + w.prompt_len).all()
    assert firsts[0] != firsts[1]
    assert (t.warmup.prompt_len >= 24 + 3).all()  # the warm-up's prompts are as long as the round's


def _engine(t: traffic.Traffic, *argv: str):
    ap = traffic.parser()
    args = ap.parse_args([*CPU, "--arms", "resident-torch", *argv, "--out", "x"])
    run = traffic.setup_run(ap, args)
    adapter = build_adapter(args.model, seed=0, device="cpu", dtype=run.dtype)
    return Engine(adapter, run.config(run.arms[0])), adapter.vocab_size


def test_a_chat_turn_is_the_whole_history_and_a_users_turns_never_overlap():
    """3 users x 3 turns arriving at 100/s, think time 20 ms, a token budget that chunks prompts: each later turn's
    prompt is the previous turn's prompt, the tokens the engine returned for it and its own new message; it was
    submitted only after the previous turn finished plus the think time."""
    argv = ["--shape", "chat", "--users", "3", "--turns", "3", "--prompt-len", "uniform:3,7", "--gen-len",
            "uniform:2,5", "--think-s", "0.02", "--rate", "100", "--token-budget", "8"]  # fmt: skip
    t = drawn(*argv)
    w = t.rounds[0]
    assert w.n == 9 and w.after.tolist() == [-1, 0, 1, -1, 3, 4, -1, 6, 7] and w.chats
    assert "3 users x 3 turns, messages uniform:3,7, replies uniform:2,5, think 0.02 s" in t.description
    engine, vocab = _engine(t, *argv)
    reqs = w.requests(vocab, t.sampling, 0, "c-")
    log: dict = {}
    results, _, _ = traffic.drive(engine, w, reqs, log=log)
    prompts, submit, finish = log["prompts"], np.array(log["submit_s"]), np.array(log["finish_s"])
    for j in range(w.n):
        a = int(w.after[j])
        if a < 0:
            assert prompts[j] == reqs[j].prompt
            continue
        assert len(results[a].tokens) >= 1
        assert prompts[j] == (*prompts[a], *results[a].tokens, *reqs[j].prompt)
        assert results[j].prompt_len == len(prompts[j])
        assert submit[j] >= finish[a] + 0.02  # a closed loop: the next message after the reply and the think time
    for u in range(3):  # each user's turns one after another, and users 10 ms apart on average overlap each other
        s, f = submit[3 * u:3 * u + 3], finish[3 * u:3 * u + 3]
        assert (s[1:] > f[:-1]).all()
    assert len(prompts[2]) == w.prompt_len[:3].sum() + sum(len(results[k].tokens) for k in range(2))


def test_a_chat_run_reports_its_shape_and_the_prompt_tokens_it_sent(tmp_path):
    out = tmp_path / "out"
    runs = traffic.main([*CPU, "--arms", "resident-torch", "--shape", "chat", "--users", "2", "--turns", "3",
                         "--prompt-len", "fixed:4", "--gen-len", "fixed:3", "--rounds", "1", "--warmup", "2",
                         "--out", str(out)])  # fmt: skip
    (r,) = runs
    lens = [4, 4 + 3 + 4, 4 + 3 + 4 + 3 + 4]  # every reply its full 3 tokens (random weights: no stop token fires)
    assert all(len(x) == 3 for x in r["tokens"]) and r["prompt_tokens"] == 2 * sum(lens)
    report = (out / "results.md").read_text()
    assert "2 users x 3 turns, messages fixed:4, replies fixed:3, think 0 s" in report
    assert "| prompt tokens |" in report
    data = json.loads((out / "results.json").read_text())
    assert data["runs"][0]["prompt_tokens"] == 2 * sum(lens) and data["rows"][0]["prompt_tokens"]["median"] == 66
    assert "2 chats of 3 turns" in data["workload"]


@pytest.mark.parametrize("args, words", [
    (["--system-len", "8"], "argument --system-len: applies to --shape system-prompt"),
    (["--shape", "system-prompt", "--users", "3"], "argument --users: applies to --shape chat"),
    (["--turns", "3"], "argument --turns: applies to --shape chat"),
    (["--shape", "chat", "--num-requests", "8"], "argument --num-requests: a chat workload sends --users x --turns"),
    (["--shape", "chat", "--think-s", "-1"], "argument --think-s: must be a number of seconds >= 0, got -1"),
    (["--shape", "chat", "--think-s", "soon"], "argument --think-s: 'soon' is not a number of seconds"),
    (["--shape", "tree"], "argument --shape: invalid choice: 'tree'"),
    (["--trace", "t.jsonl", "--shape", "chat"], "argument --trace: a trace gives arrivals and lengths: drop --shape"),
    (["--trace", "t.jsonl", "--system-len", "9"], "argument --system-len: applies to --shape system-prompt, not a "
                                                  "trace"),
    (["--shape", "chat", "--users", "2", "--turns", "41", "--prompt-len", "fixed:50", "--gen-len", "fixed:50"],
     "argument --prompt-len/--gen-len/--turns: a request of 4100 tokens (prompt + output) is over"),
    (["--shape", "system-prompt", "--prompt-len", "fixed:50", "--gen-len", "fixed:50"],
     "argument --system-len/--prompt-len/--gen-len: a request of 2100 tokens (prompt + output) does not fit "
     "--max-seq-len 2099"),
])  # fmt: skip
def test_bad_shape_arguments_end_in_one_line_before_any_engine_is_built(args, words, tmp_path, monkeypatch, capsys):
    if "2099" in words:
        args = [*args, "--max-seq-len", "2099"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "prompt_len": 4, "output_len": 2}\n')
    monkeypatch.setattr(traffic, "Engine", None)
    monkeypatch.setattr(traffic, "build_adapter", None)
    with pytest.raises(SystemExit) as info:
        traffic.main([*CPU, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and words in err, err


def test_help_names_the_shapes_and_their_options():
    text = " ".join(traffic.parser().format_help().split())
    for words in ("--shape {independent,system-prompt,chat}", "--system-len", "--users", "--turns", "--think-s",
                  '"prefix_id" and "prefix_len"', '"session", "turn" and "think_s"'):  # fmt: skip
        assert words in text, words


def _trace(tmp_path, *recs) -> object:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def test_a_traces_prefixes_and_sessions_are_read_in_arrival_order(tmp_path):
    path = _trace(tmp_path,
                  dict(arrival_s=0.3, prompt_len=5, output_len=2, session="b", turn=1, think_s=0.5),
                  dict(arrival_s=0.0, prompt_len=4, output_len=3, session="a", turn=0, prefix_id="sys", prefix_len=9),
                  dict(arrival_s=0.1, prompt_len=6, output_len=2, session="b", turn=0, prefix_id="sys", prefix_len=9),
                  dict(arrival_s=0.2, prompt_len=3, output_len=4, session="a", turn=1),
                  dict(arrival_s=0.05, prompt_len=7, output_len=1, prefix_id=3, prefix_len=2),
                  dict(arrival_s=0.0, prompt_len=2, output_len=1, session="a", turn=2, think_s=0))  # fmt: skip
    t = load_trace(path)
    # arrival order (stable): a0, a2, lone, b0, a1, b1
    assert t["arrival_s"].tolist() == [0.0, 0.0, 0.05, 0.1, 0.2, 0.3]
    assert t["prompt_len"].tolist() == [4, 2, 7, 6, 3, 5]
    assert t["after"].tolist() == [-1, 4, -1, -1, 0, 3]
    assert t["prefix_id"].tolist() == [0, -1, 1, 0, -1, -1] and t["prefix_len"].tolist() == [9, 0, 2, 9, 0, 0]
    assert t["think_s"].tolist() == [0, 0, 0, 0, 0, 0.5]
    a, p, o = read_trace(path)  # the lengths alone, as before
    assert p.tolist() == [4, 2, 7, 6, 3, 5] and o.tolist() == [3, 1, 1, 2, 4, 2]
    from models.bench.workload import Sampling, Workload

    w = Workload.build(**t, sampling=Sampling(), rng=np.random.default_rng(0), shape="x")
    # a0 = 9 + 4; a1 = a0 + its 3 out + 3 = 19; a2 = a1 + its 4 out + 2 = 25
    assert w.prompt_bound.tolist() == [13, 25, 9, 15, 19, 22]
    reqs = w.requests(VOCAB, Sampling(), 0, "t-")
    assert reqs[0].prompt[:9] == reqs[3].prompt[:9] and reqs[2].prompt[:2] != reqs[0].prompt[:2]
    assert [len(r.prompt) for r in reqs] == [13, 2, 9, 15, 3, 5]  # a later turn: its own tokens, history at send
    t2 = drawn("--trace", str(path))
    assert "2 shared prefixes of 2, 9 tokens before 3 prompts; 2 chats, 3 turns continuing one" in t2.description
    assert t2.longest == 25 + 2  # the warm-up runs the longest whole prompt for 2 tokens


@pytest.mark.parametrize("recs, words", [
    ([dict(arrival_s=0, prompt_len=4, output_len=2, prefix_id="s")], ":1: prefix_id and prefix_len go together"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, prefix_id="s", prefix_len=0)],
     ":1: prefix_len must be an integer >= 1, got 0"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, prefix_id=[1], prefix_len=3)],
     ":1: prefix_id must be a string or an integer"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, prefix_id="s", prefix_len=3),
      dict(arrival_s=0, prompt_len=4, output_len=2, prefix_id="s", prefix_len=5)],
     ":2: prefix 's' is 5 tokens here but 3 at line 1"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, turn=0)], ":1: session and turn go together"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=-1)], ":1: turn must be an integer >= 0"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session=1.5, turn=0)],
     ":1: session must be a string or an integer"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=0),
      dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=0)], ":2: session 'a' has turn 0 twice (line 1)"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=0),
      dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=2)], ":2: session 'a' has turn 2 but no turn 1"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=1)], ":1: session 'a' has turn 1 but no turn 0"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=0),
      dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=1, prefix_id="s", prefix_len=3)],
     ":2: a prefix goes on a session's first turn"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, think_s=1)], ":1: think_s is for a session's turn after the first"),
    ([dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=0),
      dict(arrival_s=0, prompt_len=4, output_len=2, session="a", turn=1, think_s=-1)],
     ":2: think_s must be a number >= 0, got -1"),
    (['{"arrival_s": 0, "prompt_len": 8, "output_len": 2}', "[1]"], ":2: expected an object"),
])  # fmt: skip
def test_a_bad_trace_field_is_named_with_its_line(tmp_path, recs, words):
    with pytest.raises(WorkloadError, match="argument --trace") as info:
        load_trace(_trace(tmp_path, *recs))
    assert words in str(info.value), str(info.value)
