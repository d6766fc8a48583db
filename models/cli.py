"""What every command-line entry point of this repository shares: errors as one line naming the argument, and the
argument types that check a value where argparse reads it."""

from __future__ import annotations

import argparse


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


def rate(text: str) -> float:
    """A number > 0, or inf."""
    r = _number(text, float, "a number (requests/s, or inf)")
    if not r > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return r
