"""translate.py's input sources: files in chunks, pipes as lines arrive, lines split as
`read_lines` splits them."""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnmt.common.errors import UserError
from attnmt.common.files import read_lines
from attnmt.decoding.inputs import ArrivingLines, FileLines, SentenceList, open_input

TEXTS = [
    b"",
    b"\n",
    b"a\n\nb\n",
    b"a\nb",
    b"\xef\xbb\xbfbom\r\nwindows\r\n\r\n",
    "Grüße\n\n\nzwei Hunde\n".encode(),
]


@pytest.mark.parametrize("data", TEXTS)
def test_file_lines_split_like_read_lines(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "in.txt").write_bytes(data)
    expected = read_lines(tmp_path / "in.txt")
    source = FileLines(io.BytesIO(data), "in.txt", buffer_size=2)
    assert source.count_lines() == len(expected)
    batches = list(source.batches())
    assert [line for batch in batches for line in batch] == expected
    assert all(len(batch) == 2 for batch in batches[:-1])


@pytest.mark.parametrize("data", TEXTS)
def test_arriving_lines_split_like_read_lines(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "in.txt").write_bytes(data)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb"):
        lines = [line for batch in ArrivingLines(read_fd, "stdin", 100).batches() for line in batch]
    assert lines == read_lines(tmp_path / "in.txt")


def test_file_lines_come_in_chunks_and_count_rewinds() -> None:
    stream = io.BytesIO(b"".join(f"line {i}\n".encode() for i in range(7)))
    source = FileLines(stream, "f", buffer_size=3)
    assert source.count_lines() == 7
    assert [len(batch) for batch in source.batches()] == [3, 3, 1]


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """An OS pipe (read end, write end); a read that blocks for 30 s fails the test."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError("reading the pipe blocked for 30 s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(30)
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def test_arriving_lines_are_given_as_they_arrive(pipe: tuple[int, int]) -> None:
    """Lines already there form one batch; a later line is given without waiting for more."""
    read_fd, write_fd = pipe
    batches = ArrivingLines(read_fd, "stdin", buffer_size=100).batches()
    os.write(write_fd, b"one\ntwo\nthr")
    assert next(batches) == ["one", "two"]  # "thr" waits for its newline
    os.write(write_fd, b"ee\n")
    assert next(batches) == ["three"]
    os.write(write_fd, b"\nlast")  # an empty line, then an unterminated one at EOF
    os.close(write_fd)
    assert [line for batch in batches for line in batch] == ["", "last"]


def test_arriving_lines_name_an_invalid_line(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.write(write_fd, "ok\nGrüße\n".encode("latin-1"))
    os.close(write_fd)
    with pytest.raises(UserError, match=r"stdin is not valid UTF-8 \(line 2"):
        list(ArrivingLines(read_fd, "stdin", buffer_size=100).batches())


def test_open_input_picks_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipe: tuple[int, int]
) -> None:
    with open_input(["a", "b"], None, 10) as source:
        assert isinstance(source, SentenceList) and source.count_lines() == 2
    (tmp_path / "in.txt").write_bytes(b"x\ny\n")
    with open_input([], str(tmp_path / "in.txt"), 10) as source:
        assert isinstance(source, FileLines) and source.count_lines() == 2
    with open(tmp_path / "in.txt", "rb") as f:  # `translate.py < in.txt`
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(f))
        with open_input([], None, 10) as source:
            assert isinstance(source, FileLines)
            assert list(source.batches()) == [["x", "y"]]
    read_fd, _ = pipe
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(os.fdopen(read_fd, "rb", closefd=False)))
    with open_input([], None, 10) as source:
        assert isinstance(source, ArrivingLines) and source.count_lines() is None
    with pytest.raises(UserError, match="not found"):
        with open_input([], str(tmp_path / "missing.txt"), 10):
            pass
    with pytest.raises(UserError, match="cannot read --input file"):
        with open_input([], str(tmp_path), 10):
            pass
