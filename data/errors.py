"""The one exception type the data package raises for user mistakes."""

from __future__ import annotations


class DataError(Exception):
    """A problem with the corpus or the data/tokenizer config that the user can fix.

    The message is a single line naming the problem and the fix, so that the CLI can print it
    to standard error without a traceback (see SPEC.md, "Errors").
    """

    def __init__(self, message: str) -> None:
        # Newlines would break the "one clear line" contract; file names never contain them.
        super().__init__(" ".join(message.splitlines()))
