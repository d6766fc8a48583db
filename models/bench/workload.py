"""Traffic a user sends: when requests arrive, how long their prompts and outputs are, how they sample.

A length is drawn from a distribution named by a string: ``fixed:512``, ``uniform:32,1536`` (integers, both ends
included) or ``lognormal:median=256,sigma=0.9,min=32,max=1536`` (exp(N(ln median, sigma^2)), rounded, redrawn until
it falls in [min, max]: truncated, not clipped, so no mass piles up at the bounds). Arrivals are Poisson at a rate
(requests/s; the first at t=0) or all at t=0 (``inf``). A trace replays a user's own traffic: a JSON-lines file with
one ``{"arrival_s", "prompt_len", "output_len"}`` a request. Every problem is a ``WorkloadError`` naming the argument
(and for a trace the line), raised before any engine is built.

Traffic that repeats itself (``--shape``; a trace's optional fields, ``read_trace``): a request may begin with a
shared prefix (``prefix_id``: every request of one id begins with the same ``prefix_len`` random tokens, drawn per
round; ``--shape system-prompt``: one for the whole round) and may continue a chat (``after``: the request whose
prompt and output tokens, exactly as they came back, its prompt repeats before its own ``prompt_len`` new tokens;
``--shape chat``: users each sending turns, a turn only once the previous one finished plus ``think_s``). A request's
``arrival_s`` is then the earliest it is sent: a chat turn goes at max(arrival_s, its previous turn's end + think_s).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import numpy as np

from models.engine import Request, SamplingParams


class WorkloadError(ValueError):
    """A workload argument that cannot be used; ``arg`` names it (``--prompt-len``, ``--trace``, ...)."""

    def __init__(self, arg: str, message: str) -> None:
        super().__init__(f"argument {arg}: {message}")
        self.arg = arg


@attrs.frozen
class Lengths:
    """A distribution of positive integer lengths (module doc), parsed from its string by ``Lengths.parse``."""

    kind: str  # fixed, uniform, lognormal
    lo: int
    hi: int
    median: float = 0.0
    sigma: float = 0.0

    @classmethod
    def parse(cls, arg: str, text: str) -> Lengths:
        kind, _, rest = text.partition(":")
        try:
            if kind == "fixed":
                n = int(rest)
                out = cls("fixed", n, n)
            elif kind == "uniform":
                lo, hi = (int(x) for x in rest.split(","))
                out = cls("uniform", lo, hi)
            elif kind == "lognormal":
                kv = dict(part.split("=", 1) for part in rest.split(","))
                if set(kv) != {"median", "sigma", "min", "max"}:
                    raise ValueError("needs median=, sigma=, min= and max=")
                out = cls("lognormal", int(kv["min"]), int(kv["max"]), float(kv["median"]), float(kv["sigma"]))
                if not (out.median > 0 and out.sigma >= 0 and math.isfinite(out.median * out.sigma)):
                    raise ValueError("median must be > 0 and sigma >= 0")
            else:
                raise ValueError("the kind must be fixed, uniform or lognormal")
        except ValueError as e:
            raise WorkloadError(arg, f"{text!r}: {e} (e.g. fixed:512, uniform:32,1536, "
                                     "lognormal:median=256,sigma=0.9,min=32,max=1536)") from None  # fmt: skip
        if not 1 <= out.lo <= out.hi:
            raise WorkloadError(arg, f"{text!r}: lengths must satisfy 1 <= min <= max")
        if out.kind == "lognormal" and not out.lo <= out.median <= out.hi:
            raise WorkloadError(arg, f"{text!r}: the median must lie in [min, max]")
        return out

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """[n] int64 lengths."""
        if self.kind == "fixed":
            return np.full(n, self.lo, np.int64)
        if self.kind == "uniform":
            return rng.integers(self.lo, self.hi + 1, n)
        out = np.zeros(n, np.int64)
        todo = np.arange(n)
        while todo.size:  # truncation by redrawing: with the median inside [min, max], half the mass or more is in
            x = np.rint(np.exp(rng.normal(math.log(self.median), self.sigma, todo.size))).astype(np.int64)
            ok = (x >= self.lo) & (x <= self.hi)
            out[todo[ok]] = x[ok]
            todo = todo[~ok]
        return out


def arrival_times(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """[n] seconds from the start: Poisson arrivals at ``rate`` requests/s (first at 0), or all at 0 for inf."""
    if math.isinf(rate):
        return np.zeros(n)
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))])


def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s, prompt_len, output_len) of a JSON-lines trace, in arrival order (``load_trace``: with its shape)."""
    t = load_trace(path)
    return t["arrival_s"], t["prompt_len"], t["output_len"]


def _name(v) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


def _at_least(path: Path, line: int, name: str, v, lo: int) -> None:
    """A trace field that must be an integer >= ``lo`` (a bool is not one): WorkloadError naming the line if not."""
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
        raise WorkloadError("--trace", f"{path}:{line}: {name} must be an integer >= {lo}, got {v!r}")


def load_trace(path: Path) -> dict[str, np.ndarray]:
    """A JSON-lines trace as ``Workload.build``'s arrays (arrival_s, prompt_len, output_len, prefix_id, prefix_len,
    after, think_s), in arrival order. Each line is ``{"arrival_s", "prompt_len", "output_len"}`` and optionally:

    * ``"prefix_id"`` (a string or integer) with ``"prefix_len"`` (an integer >= 1, the same on every line of the id):
      the prompt begins with the id's shared prefix, then its ``prompt_len`` tokens of its own;
    * ``"session"`` (a string or integer) with ``"turn"`` (0, 1, 2, ... each once in a session), and for a turn after
      the first ``"think_s"`` (a number >= 0, default 0): a chat. Turn 0 is a request like any other (it may carry a
      prefix; a later turn may not); turn k+1's prompt is turn k's prompt, the tokens turn k generated and then its
      own ``prompt_len`` new tokens, sent when turn k has finished plus ``think_s``, and not before its arrival_s.
    """
    fields = ("arrival_s", "prompt_len", "output_len")
    rows = []
    prefix_lens: dict = {}  # prefix id: (its length, the line that first gave it)
    sessions: dict = {}  # session: {turn: row index}
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise WorkloadError("--trace", f"{path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError("--trace", f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise WorkloadError("--trace", f"{path}:{i}: expected an object with {', '.join(fields)}")
        for f in fields:
            if f not in rec:
                raise WorkloadError("--trace", f"{path}:{i}: no field {f!r}")
        a, p, o = rec["arrival_s"], rec["prompt_len"], rec["output_len"]
        if not (isinstance(a, int | float) and math.isfinite(a) and a >= 0):
            raise WorkloadError("--trace", f"{path}:{i}: arrival_s must be a number >= 0, got {a!r}")
        for name, v in (("prompt_len", p), ("output_len", o)):
            _at_least(path, i, name, v, 1)
        pid, plen = rec.get("prefix_id"), rec.get("prefix_len")
        if (pid is None) != (plen is None):
            raise WorkloadError("--trace", f"{path}:{i}: prefix_id and prefix_len go together")
        if pid is not None:
            if not _name(pid):
                raise WorkloadError("--trace", f"{path}:{i}: prefix_id must be a string or an integer, got {pid!r}")
            _at_least(path, i, "prefix_len", plen, 1)
            was = prefix_lens.setdefault(pid, (plen, i))
            if was[0] != plen:
                raise WorkloadError("--trace", f"{path}:{i}: prefix {pid!r} is {plen} tokens here but {was[0]} at "
                                               f"line {was[1]}")  # fmt: skip
        sess, turn, think = rec.get("session"), rec.get("turn"), rec.get("think_s")
        if (sess is None) != (turn is None):
            raise WorkloadError("--trace", f"{path}:{i}: session and turn go together")
        if sess is not None:
            if not _name(sess):
                raise WorkloadError("--trace", f"{path}:{i}: session must be a string or an integer, got {sess!r}")
            _at_least(path, i, "turn", turn, 0)
            turns = sessions.setdefault(sess, {})
            if turn in turns:
                raise WorkloadError("--trace", f"{path}:{i}: session {sess!r} has turn {turn} twice (line "
                                               f"{rows[turns[turn]][-1]})")  # fmt: skip
            turns[turn] = len(rows)
            if turn > 0 and pid is not None:
                raise WorkloadError("--trace", f"{path}:{i}: a prefix goes on a session's first turn; turn {turn} "
                                               "repeats the one before it")  # fmt: skip
        if think is not None:
            if sess is None or turn == 0:
                raise WorkloadError("--trace", f"{path}:{i}: think_s is for a session's turn after the first")
            if not (isinstance(think, int | float) and not isinstance(think, bool) and math.isfinite(think)
                    and think >= 0):  # fmt: skip
                raise WorkloadError("--trace", f"{path}:{i}: think_s must be a number >= 0, got {think!r}")
        rows.append((float(a), p, o, pid, plen or 0, float(think or 0.0), i))
    if not rows:
        raise WorkloadError("--trace", f"{path}: no requests")
    after = [-1] * len(rows)
    for sess, turns in sessions.items():
        for t in range(max(turns) + 1):
            if t not in turns:
                later = min(k for k in turns if k > t)
                raise WorkloadError("--trace", f"{path}:{rows[turns[later]][-1]}: session {sess!r} has turn {later} "
                                               f"but no turn {t}")  # fmt: skip
            if t:
                after[turns[t]] = turns[t - 1]
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])  # stable: lines of one arrival keep their order
    where = {k: j for j, k in enumerate(order)}
    ids = {pid: n for n, pid in enumerate(prefix_lens)}
    return dict(arrival_s=np.array([rows[k][0] for k in order]),
                prompt_len=np.array([rows[k][1] for k in order], np.int64),
                output_len=np.array([rows[k][2] for k in order], np.int64),
                prefix_id=np.array([-1 if rows[k][3] is None else ids[rows[k][3]] for k in order], np.int64),
                prefix_len=np.array([rows[k][4] for k in order], np.int64),
                after=np.array([-1 if after[k] < 0 else where[after[k]] for k in order], np.int64),
                think_s=np.array([rows[k][5] for k in order]))  # fmt: skip


@attrs.frozen
class Sampling:
    """How the sampled fraction of requests samples, and which requests carry stop tokens."""

    sampled_frac: float = 0.0
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 50
    stop_frac: float = 0.0
    stop_tokens: int = 4  # stop tokens a request with them carries (random ids)
    scored_frac: float = 0.0  # requests that score their prompt (an eval harness's: prompt logprobs, k = 1)


def _none(n: int, fill, dtype) -> np.ndarray:
    return np.full(n, fill, dtype)


@attrs.frozen(eq=False)
class Workload:
    """n requests and when they arrive (seconds from the run's start, sorted), each perhaps beginning with a shared
    prefix or continuing a chat (module doc)."""

    arrival_s: np.ndarray  # [n] float64: when it is sent (a chat's later turn: the earliest it is)
    prompt_len: np.ndarray  # [n] int64: its own new prompt tokens (after a prefix, or a chat's history)
    output_len: np.ndarray  # [n] int64
    sampled: np.ndarray  # [n] bool
    stops: np.ndarray  # [n] bool: carries stop tokens
    prefix_id: np.ndarray = None  # [n] int64: the shared prefix it begins with (-1: none)
    prefix_len: np.ndarray = None  # [n] int64: that prefix's tokens (0: none)
    after: np.ndarray = None  # [n] int64: the request (index) whose prompt + output it continues (-1: none)
    think_s: np.ndarray = None  # [n] float64: after that one finished, this long before it is sent
    scored: np.ndarray = None  # [n] bool: scores its prompt (its tokens' logprobs, and its output's: k = 1)
    shape: str = ""  # how the traffic repeats itself, for ``describe`` ("" independent prompts)

    def __attrs_post_init__(self) -> None:
        n = self.arrival_s.size
        for name, fill, dtype in (("prefix_id", -1, np.int64), ("prefix_len", 0, np.int64), ("after", -1, np.int64),
                                  ("think_s", 0.0, np.float64), ("scored", False, bool)):  # fmt: skip
            if getattr(self, name) is None:
                object.__setattr__(self, name, _none(n, fill, dtype))

    @property
    def n(self) -> int:
        return self.arrival_s.size

    @property
    def chats(self) -> bool:
        """Some request continues another: its prompt is known only once that one has finished."""
        return bool((self.after >= 0).any())

    @property
    def prompt_bound(self) -> np.ndarray:
        """[n] int64: each request's whole prompt (prefix, a chat's history, its own tokens) where every request
        before it generates all of its output_len (the most it can be)."""
        out = self.prefix_len + self.prompt_len
        if self.chats:
            out = out.copy()
            for j in self._chain_order():
                a = self.after[j]
                if a >= 0:
                    out[j] += out[a] + self.output_len[a]
        return out

    def _chain_order(self) -> list[int]:
        """The indices, every request after the one it continues."""
        order, seen = [], np.zeros(self.n, bool)
        for j in range(self.n):
            chain = []
            while j >= 0 and not seen[j]:
                chain.append(j)
                seen[j] = True
                j = int(self.after[j])
            order += chain[::-1]
        return order

    @classmethod
    def build(cls, arrival_s, prompt_len, output_len, sampling: Sampling, rng: np.random.Generator,
              shape: str = "", **more) -> Workload:  # fmt: skip
        """The workload of these arrivals and lengths (``more``: prefix_id, prefix_len, after, think_s), which of
        its requests sample, carry stop tokens and (drawn only when some do) score their prompts drawn from
        ``rng``."""
        n = arrival_s.size
        sampled, stops = rng.random(n) < sampling.sampled_frac, rng.random(n) < sampling.stop_frac
        scored = rng.random(n) < sampling.scored_frac if sampling.scored_frac else None
        return cls(arrival_s, prompt_len, output_len, sampled, stops, scored=scored, shape=shape, **more)

    def requests(self, vocab: int, sampling: Sampling, seed: int, prefix: str) -> list[Request]:
        """The requests: random prompt tokens, ids ``{prefix}{i}``, per-request sampling seeds (same for a seed). A
        request with a shared prefix begins with it (each prefix's tokens drawn from the seed and its id); a chat's
        later turn holds only its own new tokens here: ``continued`` puts its history before them when it is sent."""
        rng = np.random.default_rng(seed)
        prefixes = {int(p): np.random.default_rng([seed, 1 << 20, int(p)]).integers(0, vocab, int(n)).tolist()
                    for p, n in zip(self.prefix_id, self.prefix_len, strict=True) if p >= 0}  # fmt: skip
        out = []
        for i in range(self.n):
            prompt = rng.integers(0, vocab, int(self.prompt_len[i])).tolist()
            if self.prefix_id[i] >= 0:
                prompt = prefixes[int(self.prefix_id[i])] + prompt
            stops = tuple(rng.integers(0, vocab, sampling.stop_tokens).tolist()) if self.stops[i] else ()
            sp = SamplingParams(max_tokens=int(self.output_len[i]), seed=int(rng.integers(0, 2**31 - 1)),
                                stop_token_ids=stops)  # fmt: skip
            if self.sampled[i]:
                sp = attrs.evolve(sp, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            if self.scored[i]:
                sp = attrs.evolve(sp, logprobs=1, prompt_logprobs=1)
            out.append(Request(prompt, sp, request_id=f"{prefix}{i}"))
        return out

    def describe(self) -> str:
        """One line: how many, over how long, and the lengths' spread (and what the prompts share)."""
        def spread(x: np.ndarray) -> str:
            return f"median {np.median(x):.0f}, mean {x.mean():.0f}, {x.min()}-{x.max()}"

        last = self.arrival_s.max()
        span = f"over {last:.1f} s" if last > 0 else "all at t=0"
        if self.chats:
            span = f"first turns {span}"
        own = "prompts" if not self.shape else "own prompt tokens"
        out = (f"{self.n} requests {span}; {own} {spread(self.prompt_len)}; outputs {spread(self.output_len)}; "
               f"{int(self.sampled.sum())} sampled, {int(self.stops.sum())} with stop tokens")
        if self.scored.any():
            out += f", {int(self.scored.sum())} scoring their prompts"
        if self.shape:
            out += f"; {self.shape}; whole prompts {spread(self.prompt_bound)}"
            if self.chats:
                out += " (at most: every reply its full length)"
        return out


def continued(request: Request, history: list[int] | tuple[int, ...]) -> Request:
    """A chat turn as it is sent: ``history`` (the previous turn's prompt and output tokens) before its own tokens."""
    return attrs.evolve(request, prompt=(*history, *request.prompt))
