"""Where `translate.py`'s sentences come from, read a batch at a time so that memory stays
bounded however long the input is.

- `SentenceList`: the positional sentences.
- `FileLines`: a file (`--input FILE`, or standard input redirected from a file): batches of
  `buffer_size` lines, read as the translation goes.
- `ArrivingLines`: a pipe or a terminal: each batch is every complete line that has arrived
  (at least one; up to about `buffer_size` when lines come faster than they are translated),
  so that a line typed is translated before the next one is read. Reads the file descriptor
  with `os.read` (never through Python's buffered `sys.stdin`, which would hold back lines).

Every source splits lines as `common.files.read_lines` does (a final newline ends the last
line, "\\r\\n" accepted, a byte-order mark dropped) and raises `UserError` for invalid UTF-8,
naming the line.
"""

from __future__ import annotations

import io
import os
import select
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import BinaryIO

from attnmt.common.errors import UserError
from attnmt.common.files import decode_line, iter_lines

STDIN = "standard input"
_READ_SIZE = 1 << 16  # bytes per os.read: one full Linux pipe buffer


class Input:
    """Sentences to translate, a batch (list of lines) at a time."""

    interactive = False  # True: batches are what has arrived so far (pipe, terminal)
    keep_cr = False  # True: a "\r\n" line keeps its "\r" (decode_line)

    def batches(self) -> Iterator[list[str]]:
        raise NotImplementedError

    def count_lines(self) -> int | None:
        """How many lines `batches` will give, when that can be known up front (else None)."""
        return None


class SentenceList(Input):
    def __init__(self, sentences: list[str], buffer_size: int) -> None:
        self.sentences = sentences
        self.buffer_size = buffer_size

    def batches(self) -> Iterator[list[str]]:
        for start in range(0, len(self.sentences), self.buffer_size):
            yield self.sentences[start : start + self.buffer_size]

    def count_lines(self) -> int:
        return len(self.sentences)


class FileLines(Input):
    """Lines of a binary stream, `buffer_size` at a time."""

    def __init__(self, stream: BinaryIO, name: str, buffer_size: int) -> None:
        self.stream = stream
        self.name = name
        self.buffer_size = buffer_size

    def batches(self) -> Iterator[list[str]]:
        batch: list[str] = []
        for line in iter_lines(self.stream, self.name, self.keep_cr):
            batch.append(line)
            if len(batch) == self.buffer_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def count_lines(self) -> int | None:
        """Newlines from here to the end (plus an unterminated last line), then seek back."""
        if not self.stream.seekable():
            return None
        start = self.stream.tell()
        count, last = 0, b"\n"
        try:
            while block := self.stream.read(1 << 20):
                count += block.count(b"\n")
                last = block[-1:]
        except OSError as e:
            raise UserError(f"cannot read {self.name} ({e.strerror}); check the file") from None
        finally:
            self.stream.seek(start)
        return count + (last != b"\n")


class ArrivingLines(Input):
    """Lines of a pipe or terminal, translated as they arrive."""

    interactive = True

    def __init__(self, fd: int, name: str, buffer_size: int) -> None:
        self.fd = fd
        self.name = name
        self.buffer_size = buffer_size

    def batches(self) -> Iterator[list[str]]:
        pending = b""  # bytes read but not yet split into complete lines
        number = 0  # lines given so far
        eof = False
        while not eof:
            data = os.read(self.fd, _READ_SIZE)  # blocks until at least one byte (or EOF)
            eof = not data
            pending += data
            # Take what else has already arrived, without waiting for more.
            while not eof and pending.count(b"\n") < self.buffer_size and self._ready():
                data = os.read(self.fd, _READ_SIZE)
                eof = not data
                pending += data
            *lines, pending = pending.split(b"\n")
            if eof and pending:  # an unterminated last line
                lines, pending = [*lines, pending], b""
            if lines:
                yield [
                    decode_line(raw, number + i, self.name, self.keep_cr)
                    for i, raw in enumerate(lines, 1)
                ]
                number += len(lines)

    def _ready(self) -> bool:
        readable, _, _ = select.select([self.fd], [], [], 0)
        return bool(readable)


@contextmanager
def open_input(sentences: list[str], path: str | None, buffer_size: int) -> Iterator[Input]:
    """The sentences, else the file at `path`, else standard input (a file, pipe or terminal).

    Raises:
        UserError: `path` is missing or unreadable.
    """
    if sentences:
        yield SentenceList(sentences, buffer_size)
        return
    if path is not None:
        try:
            stream = open(path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            raise UserError(f"--input file not found: {path}; check the path") from None
        except OSError as e:
            raise UserError(
                f"cannot read --input file {path} ({e.strerror}); check the path"
            ) from None
        with stream:
            yield FileLines(stream, path, buffer_size)
        return
    fd = _fileno(sys.stdin)
    if fd is None or stat.S_ISREG(os.fstat(fd).st_mode):  # `< file` (or an in-memory stream)
        yield FileLines(sys.stdin.buffer, STDIN, buffer_size)
    else:
        yield ArrivingLines(fd, STDIN, buffer_size)


def _fileno(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return None


class AlignedLines:
    """A file read in step with the input, line for line (`--prefix FILE`, `--score FILE`):
    `take(n)` gives its next n lines; a file shorter or longer than the input is a
    `UserError` that names both counts where they are known.
    """

    def __init__(self, stream: BinaryIO, path: str, flag: str) -> None:
        self.path = path
        self.flag = flag
        self._lines = iter_lines(stream, path)
        self._taken = 0

    def take(self, n: int) -> list[str]:
        lines = list(islice(self._lines, n))
        self._taken += len(lines)
        if len(lines) < n:
            raise UserError(
                f"{self.flag} {self.path} has {self._taken} lines but the input has more; "
                "pass a file with one line per input line"
            )
        return lines

    def check_end(self, n_inputs: int) -> None:
        """Raise if lines remain after the input's `n_inputs` lines."""
        if next(self._lines, None) is not None:
            raise UserError(
                f"{self.flag} {self.path} has more lines than the input ({n_inputs}); "
                "pass a file with one line per input line"
            )


@contextmanager
def open_aligned(
    path: str | None, flag: str, n_inputs: int | None
) -> Iterator[AlignedLines | None]:
    """`AlignedLines` of `path` (None: no file); when the input's line count `n_inputs` is
    known, a different count is an error before anything is translated.

    Raises:
        UserError: `path` is missing or unreadable, or its line count differs.
    """
    if path is None:
        yield None
        return
    try:
        stream = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise UserError(f"cannot read {flag} file {path} ({e.strerror}); check the path") from None
    with stream:
        if n_inputs is not None:
            count = FileLines(stream, path, 1).count_lines()
            if count != n_inputs:
                raise UserError(
                    f"{flag} {path} has {count} lines but the input has {n_inputs}; "
                    "pass a file with one line per input line"
                )
        yield AlignedLines(stream, path, flag)
