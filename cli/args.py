"""What every command line shares: its program name, a parser whose errors are one line, and
number types with limits."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


def program_name(script: str) -> str:
    """The name a user typed: `attnmt-translate` for the console command, else the shim's
    `translate.py`, so an error line names the command that was run."""
    typed = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return typed if typed.startswith("attnmt-") else script


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported as one line (no usage block) and exit status 2."""

    def error(self, message: str) -> None:
        program = self.prog.split()[0]  # a subcommand's parser is "export.py ct2"
        self.exit(2, f"{program}: error: {message} (see --help)\n")


def number(kind: type, minimum: float | None = None) -> Callable[[str], int | float]:
    """An argparse type: an int or float, at least `minimum` when given."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse
