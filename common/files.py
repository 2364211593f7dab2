"""File I/O with two guarantees: writes are atomic (readers and a killed process never leave
half a file), and text is read as UTF-8 with a one-line error naming the file and line."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from attnmt.common.errors import UserError


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: a temp file in the same folder, renamed over
    `path` (after fsync) when the `with` block ends without an error.

    The file gets the usual permissions (0666 minus the umask), not mkstemp's 0600. On any
    error in the block (Ctrl-C included), the temp file is removed and the previous `path`, if
    any, is untouched. For writing as you go, e.g. translations of a long input.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Write `data` to `path` atomically (`atomic_open`: temp file, fsync, rename).

    `data` is bytes, text (written as UTF-8 with "\\n" line ends) or a function that writes
    into the open binary file (e.g. `lambda f: torch.save(obj, f)`). On any error, the previous
    `path`, if any, is untouched.
    """
    with atomic_open(path) as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)


def read_lines(path: str | Path | None, label: str = "input") -> list[str]:
    """Lines of a UTF-8 file (standard input when `path` is None), without line ends.

    A final newline ends the last line rather than starting an empty one; "\\r\\n" ends are
    accepted; a UTF-8 byte-order mark is dropped.

    Raises:
        UserError: the file is missing, unreadable or not UTF-8 (the message names the line).
    """
    if path is None:
        return list(iter_lines(sys.stdin.buffer, "standard input"))
    try:
        stream = open(path, "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        raise UserError(f"{label} file not found: {path}; check the path") from None
    except OSError as e:
        raise UserError(f"cannot read {label} file {path} ({e.strerror}); check the path") from None
    with stream:
        return list(iter_lines(stream, path))


def read_src_ref(
    src: str | Path, ref: str | Path | None, limit: int = 0
) -> tuple[list[str], list[str] | None]:
    """`--src` lines and the `--ref` lines that go with them (None without `ref`), the first
    `limit` of each (0 = all). Raises UserError when the two differ in length."""
    lines = read_lines(src, "--src")
    refs = read_lines(ref, "--ref") if ref else None
    if limit:
        lines, refs = lines[:limit], refs[:limit] if refs else None
    if refs is not None and len(refs) != len(lines):
        raise UserError(f"--ref has {len(refs)} lines but --src has {len(lines)}")
    return lines, refs


def decode_line(raw: bytes, number: int, name: str | Path, keep_cr: bool = False) -> str:
    """One line of UTF-8 input without its "\\n" or "\\r\\n" end (`keep_cr`: without its
    "\\n", so a "\\r\\n" line ends in "\\r"); line 1 loses a byte-order mark.

    Raises:
        UserError: not UTF-8 (the message names `name` and the line `number`, 1-based).
    """
    raw = raw.removesuffix(b"\n")
    if not keep_cr:
        raw = raw.removesuffix(b"\r")
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(name, number, e) from None


def iter_lines(stream: BinaryIO, name: str | Path, keep_cr: bool = False) -> Iterator[str]:
    """The lines of a binary stream as `read_lines` splits them (`keep_cr`: as `decode_line`
    keeps them), one at a time (memory stays bounded however long the file is).

    Raises:
        UserError: a line is not UTF-8, or reading fails (the message names `name`).
    """
    number = 0
    try:
        for number, raw in enumerate(stream, 1):
            yield decode_line(raw, number, name, keep_cr)
    except OSError as e:
        raise UserError(
            f"cannot read {name} after line {number} ({e.strerror}); check the file"
        ) from None


def _not_utf8(name: str | Path, line: int, e: UnicodeDecodeError) -> UserError:
    return UserError(
        f"{name} is not valid UTF-8 (line {line}: {e.reason}); "
        "convert it to UTF-8, e.g. with iconv -f latin1 -t utf-8"
    )
