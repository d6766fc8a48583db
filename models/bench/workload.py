"""Traffic a user sends: when requests arrive, how long their prompts and outputs are, how they sample.

A length is drawn from a distribution named by a string: ``fixed:512``, ``uniform:32,1536`` (integers, both ends
included) or ``lognormal:median=256,sigma=0.9,min=32,max=1536`` (exp(N(ln median, sigma^2)), rounded, redrawn until
it falls in [min, max]: truncated, not clipped, so no mass piles up at the bounds). Arrivals are Poisson at a rate
(requests/s; the first at t=0) or all at t=0 (``inf``). A trace replays a user's own traffic: a JSON-lines file with
one ``{"arrival_s", "prompt_len", "output_len"}`` a request. Every problem is a ``WorkloadError`` naming the argument
(and for a trace the line), raised before any engine is built.
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
    """(arrival_s, prompt_len, output_len) of a JSON-lines trace, in arrival order."""
    fields = ("arrival_s", "prompt_len", "output_len")
    rows = []
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
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise WorkloadError("--trace", f"{path}:{i}: {name} must be an integer >= 1, got {v!r}")
        rows.append((float(a), p, o))
    if not rows:
        raise WorkloadError("--trace", f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    a, p, o = zip(*rows, strict=True)
    return np.array(a), np.array(p, np.int64), np.array(o, np.int64)


@attrs.frozen
class Sampling:
    """How the sampled fraction of requests samples, and which requests carry stop tokens."""

    sampled_frac: float = 0.0
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 50
    stop_frac: float = 0.0
    stop_tokens: int = 4  # stop tokens a request with them carries (random ids)


@attrs.frozen(eq=False)
class Workload:
    """n requests and when they arrive (seconds from the run's start, sorted)."""

    arrival_s: np.ndarray  # [n] float64
    prompt_len: np.ndarray  # [n] int64
    output_len: np.ndarray  # [n] int64
    sampled: np.ndarray  # [n] bool
    stops: np.ndarray  # [n] bool: carries stop tokens

    @property
    def n(self) -> int:
        return self.arrival_s.size

    @classmethod
    def build(cls, arrival_s, prompt_len, output_len, sampling: Sampling, rng: np.random.Generator) -> Workload:
        n = arrival_s.size
        return cls(arrival_s, prompt_len, output_len, rng.random(n) < sampling.sampled_frac,
                   rng.random(n) < sampling.stop_frac)  # fmt: skip

    def requests(self, vocab: int, sampling: Sampling, seed: int, prefix: str) -> list[Request]:
        """The requests: random prompt tokens, ids ``{prefix}{i}``, per-request sampling seeds (same for a seed)."""
        rng = np.random.default_rng(seed)
        out = []
        for i in range(self.n):
            prompt = rng.integers(0, vocab, int(self.prompt_len[i])).tolist()
            stops = tuple(rng.integers(0, vocab, sampling.stop_tokens).tolist()) if self.stops[i] else ()
            sp = SamplingParams(max_tokens=int(self.output_len[i]), seed=int(rng.integers(0, 2**31 - 1)),
                                stop_token_ids=stops)  # fmt: skip
            if self.sampled[i]:
                sp = attrs.evolve(sp, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            out.append(Request(prompt, sp, request_id=f"{prefix}{i}"))
        return out

    def describe(self) -> str:
        """One line: how many, over how long, and the lengths' spread."""
        def spread(x: np.ndarray) -> str:
            return f"median {np.median(x):.0f}, mean {x.mean():.0f}, {x.min()}-{x.max()}"

        span = f"over {self.arrival_s[-1]:.1f} s" if self.arrival_s[-1] > 0 else "all at t=0"
        return (f"{self.n} requests {span}; prompts {spread(self.prompt_len)}; outputs {spread(self.output_len)}; "
                f"{int(self.sampled.sum())} sampled, {int(self.stops.sum())} with stop tokens")
