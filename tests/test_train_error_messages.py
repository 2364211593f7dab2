"""Error messages as users read them: the docs quote what the code prints, and a Hub failure
is one line on stderr."""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
from functools import cache

import pytest

from attnmt.data import dataset
from attnmt.data.dataset import DataConfig
from attnmt.data.errors import DataError
from tests.train_helpers import ROOT

DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
SOURCE_DIRS = (
    "checkpoint cli common data decoding engine evaluation exporting model server training scripts"
).split()
WILD = None  # a placeholder of a message template: any text
MIN_LITERAL = 15  # characters a template must match literally, so `f"{e}"` matches nothing


def quoted_errors() -> list[tuple[str, str]]:
    """(where, message) of every `<prog>.py: error: <message>` the docs quote: in backticks
    (wrapped lines joined) or as a line of a code block; `...` stands for omitted text."""
    found = []
    for path in DOCS:
        text = path.read_text()
        spans = re.findall(r"`([\w-]+\.py: error: [^`]*)`", text)
        spans += re.findall(r"^([\w-]+\.py: error: .*)$", text, re.M)
        for span in spans:
            message = " ".join(span.split(": error: ", 1)[1].split())
            if len(re.sub(r"\.\.\.|<[^>]*>|\W", "", message)) >= 8:  # not just `<problem>`
                found.append((f"{path.name}: {span[:60]}", message))
    return found


@cache
def templates() -> list[list[str | None]]:
    """Every string literal of the code as tokens: its text, `WILD` for each `{...}` of an
    f-string (adjacent literals are one string to `ast`)."""
    out = []
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.JoinedStr):
                    out.append(
                        [v.value if isinstance(v, ast.Constant) else WILD for v in node.values]
                    )
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append([node.value])
    return out


def fits(tokens: list[str | None], text: str, need: int, literal: int = 0) -> bool:
    """Whether `text` is the start of some rendering of `tokens`, with at least `need` of its
    characters matched by literal text (`literal`: so far)."""
    if not text:
        return literal >= need
    if not tokens:
        return False
    head, rest = tokens[0], tokens[1:]
    if head is WILD:
        while rest and rest[0] is WILD:
            rest = rest[1:]
        if not rest:
            return literal >= need
        after = rest[0]
        starts = [m.start() for m in re.finditer(re.escape(after), text)]
        starts += [i for i in range(max(0, len(text) - len(after)), len(text) + 1)]
        return any(fits(rest, text[i:], need, literal) for i in sorted(set(starts)))
    if text.startswith(head):
        return fits(rest, text[len(head) :], need, literal + len(head))
    return head.startswith(text) and literal + len(text) >= need


def printed(message: str) -> bool:
    """Whether some template renders `message`: its first piece (up to a `...`) as the start
    of the message with MIN_LITERAL characters of the template's own text; each later piece
    consistent with the rest of that template (it may run on into text a placeholder
    holds)."""
    first, *later = [piece.strip() for piece in message.split("...")]
    for tokens in templates():
        if not fits(tokens, first, min(MIN_LITERAL, len(first))):
            continue
        if all(any(fits(tail, piece, 0) for tail in tails(tokens)) for piece in later if piece):
            return True
    return False


def tails(tokens: list[str | None]) -> list[list[str | None]]:
    """Where a later piece may begin: at any placeholder or character of the template."""
    out = []
    for i, token in enumerate(tokens):
        if token is WILD:
            out.append(tokens[i:])
        else:
            out += [[token[k:], *tokens[i + 1 :]] for k in range(len(token))]
    return out


@pytest.mark.parametrize("where, message", quoted_errors())
def test_every_error_the_docs_quote_is_one_the_code_prints(where, message):
    assert printed(message), f"{where}: the code prints no such message: {message}"


def test_the_checker_tells_a_printed_message_from_a_stale_one():
    hub = "cannot reach the Hugging Face Hub to load 'bentrevett/multi30k' (...); to use local"
    assert printed(hub)
    assert not printed("could not load 'bentrevett/multi30k' from the Hugging Face Hub ...")
    assert any("training.md" in where for where, _ in quoted_errors())


def test_the_hub_clients_retry_warnings_are_silenced(monkeypatch, caplog):
    def unreachable(*args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        raise ConnectionError("Couldn't reach 'x/y' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(dataset.datasets, "load_dataset", unreachable)
    level = logging.getLogger("huggingface_hub").level
    with caplog.at_level(logging.WARNING), pytest.raises(DataError, match="cannot reach the Hug"):
        dataset._open_hub(DataConfig(hub_name="x/y"))
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]
    assert logging.getLogger("huggingface_hub").level == level  # restored


@pytest.mark.slow
def test_an_unreachable_hub_is_one_line_on_stderr(tmp_path):
    """The Hub at a closed local port: after the client's retries, stderr holds one line."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "data.dir=null",
        "trainer.device=cpu",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("train.py: error: cannot reach the Hugging Face Hub to load "), line
    assert "[train][ERROR]" not in proc.stdout
    assert "cannot reach the Hugging Face Hub" in (tmp_path / "run" / "train.log").read_text()
