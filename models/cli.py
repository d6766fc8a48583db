"""What every command-line entry point of this repository shares: errors as one line naming the argument, and the
argument types that check a value where argparse reads it."""

from __future__ import annotations

import argparse
import math


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (``prog: error: argument --x: ...``), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    n = _number(text, int, "an integer")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def token_budget(text: str) -> int | None:
    """``auto`` (None: the engine's default by where its passes run, EngineConfig.token_budget) or an integer >= 1."""
    return None if text == "auto" else positive_int(text)


def budget_field(budget: int | None) -> dict:
    """The EngineConfig field a ``--token-budget`` sets: none for ``auto`` (the config's default), else the number."""
    return {} if budget is None else {"token_budget": budget}


def seed(text: str) -> int:
    """An integer in [0, 2^31)."""
    n = _number(text, int, "an integer")
    if not 0 <= n < 2**31:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^31), got {n}")
    return n


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    f = _number(text, float, "a number")
    if not 0 <= f <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return f


def burst_wait_ms(text: str) -> float:
    """Milliseconds in [0, 1000]: how long an idle engine may gather a burst (the server's --burst-wait-ms)."""
    ms = _number(text, float, "a number of milliseconds")
    if not 0 <= ms <= 1000:
        raise argparse.ArgumentTypeError(f"must be in [0, 1000], got {text}")
    return ms


def rate(text: str) -> float:
    """A number > 0, or inf."""
    r = _number(text, float, "a number (requests/s, or inf)")
    if not r > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return r


def temperature(text: str) -> float:
    """A finite number >= 0 (0 is greedy), as SamplingParams.temperature takes."""
    t = _number(text, float, "a number")
    if not (math.isfinite(t) and t >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 is greedy), got {text}")
    return t


def top_p(text: str) -> float:
    """A number in (0, 1], as SamplingParams.top_p takes."""
    p = _number(text, float, "a number")
    if not 0 < p <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return p


def top_k(text: str) -> int:
    """An integer in [0, CANDIDATES] (0 is off), as SamplingParams.top_k takes."""
    from models.engine.requests import CANDIDATES

    k = _number(text, int, "an integer")
    if not 0 <= k <= CANDIDATES:
        raise argparse.ArgumentTypeError(f"must be in [0, {CANDIDATES}] (0 is off; sampling looks at the {CANDIDATES} "
                                         f"most likely tokens), got {k}")  # fmt: skip
    return k


def int32(text: str) -> int:
    """An integer in the int32 range, as SamplingParams.seed takes."""
    from models.engine.requests import INT32_MAX, INT32_MIN

    n = _number(text, int, "an integer")
    if not INT32_MIN <= n <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be an int32, in [{INT32_MIN}, {INT32_MAX}], got {n}")
    return n
