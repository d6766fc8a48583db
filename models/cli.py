"""What every command-line entry point of this repository shares: errors as one line, naming the argument."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (``prog: error: argument --x: ...``), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
