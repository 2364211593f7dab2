"""The one error type for mistakes a user can fix.

Every command-line entry point (`train.py`, `translate.py`, `scripts/*.py`) catches
`UserError` and prints its message as one line, `<prog>: error: <message>`, with a non-zero
exit status and no traceback. Packages derive their own errors from it
(`DataError`, `CheckpointError`, `ConfigError`, `DeviceError`, `TrainingError`), so a new one
is caught everywhere without a list to keep in sync.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """A problem the user can fix; the message is one line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        # Newlines would break the "one clear line" contract; file names never contain them.
        super().__init__(" ".join(str(message).splitlines()))


def exit_status(prog: str, run: Callable[[], object]) -> int:
    """Run a command's body; the exit status a command-line entry point returns.

    0 on success; a `UserError` prints `<prog>: error: <message>` and gives 1; Ctrl-C prints
    `<prog>: interrupted` and gives 130; a closed stdout (`| head`) gives 1 quietly.
    """
    try:
        run()
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left; not an error worth a traceback
        sys.stderr.close()
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
