"""The one exception type the data package raises for user mistakes."""

from __future__ import annotations

from attnmt.common.errors import UserError


class DataError(UserError):
    """A problem with the corpus or the data/tokenizer config that the user can fix.

    The message is a single line naming the problem and the fix, so that the CLI can print it
    to standard error without a traceback.
    """
