"""The one error type for mistakes a user can fix.

Every command-line entry point (`train.py`, `translate.py`, `scripts/*.py`) catches
`UserError` and prints its message as one line, `<prog>: error: <message>`, with a non-zero
exit status and no traceback (SPEC.md, "Errors"). Packages derive their own errors from it
(`DataError`, `CheckpointError`, `ConfigError`, `DeviceError`, `TrainingError`), so a new one
is caught everywhere without a list to keep in sync.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message is one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        # Newlines would break the "one clear line" contract; file names never contain them.
        super().__init__(" ".join(str(message).splitlines()))
