"""Every command's --help is whole: no description, epilog or flag help stops mid-sentence (a
docstring's first line taken alone did: `score.py --help` ended "... signatures, and the")."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

# The argparse commands (train.py and prepare_data.py take Hydra overrides; see below).
COMMANDS = ("average", "distill", "export", "export_check", "import_hf", "score", "serve")
COMMANDS += ("translate",)
# Words a sentence or a phrase does not end on: a string ending on one was cut.
DANGLING = set(
    "a an the and or but nor of to in on at by for from with as than that which whose its "
    "their his her our your is are be was were each every when where while if".split()
)


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and its subcommands' parsers (export.py hf, ct2)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def texts(parser: argparse.ArgumentParser) -> list[tuple[str, str, bool]]:
    """(where, text, whether it is prose that must end a sentence) for a parser's strings."""
    found = [(f"{parser.prog} {part}", text, True) for part, text in (
        ("description", parser.description), ("epilog", parser.epilog)
    ) if text]  # fmt: skip
    for action in parser._actions:
        if action.help and action.help != argparse.SUPPRESS:
            name = "/".join(action.option_strings) or action.dest
            found.append((f"{parser.prog} {name}", action.help, False))
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found.append((f"{parser.prog} {choice.dest}", choice.help or "", False))
    return found


def cut(text: str, sentence: bool) -> str | None:
    """Why `text` looks cut mid-way, or None when it looks whole."""
    text = " ".join(text.split())
    if not text:
        return "empty"
    if sentence and not re.search(r"[.!?)]$", text):
        return "no full stop at the end"
    words = re.findall(r"[A-Za-z]+", text.split()[-1])
    if text[-1] in ",;:-(" or (words and words[-1].lower() in DANGLING):
        return f"ends on {text.split()[-1]!r}"
    for left, right in ("()", "[]", "{}"):
        if text.count(left) != text.count(right):
            return f"unbalanced {left}{right}"
    return None


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_string_is_whole(command: str) -> None:
    module = importlib.import_module(f"attnmt.cli.{command}")
    problems = [
        f"{where}: {why}: {text!r}"
        for parser in parsers(module.build_parser())
        for where, text, sentence in texts(parser)
        if (why := cut(text, sentence))
    ]
    assert not problems, "\n".join(problems)


def test_the_checker_finds_a_cut_description() -> None:
    assert cut("Score translations: BLEU and chrF with their signatures, and the", True)
    assert cut("a file (default: 5", False) == "unbalanced ()"
    assert cut("Score translations against references.", True) is None


def test_score_help_prints_its_whole_summary(capsys: pytest.CaptureFixture[str]) -> None:
    from attnmt.cli import score

    with pytest.raises(SystemExit) as stop:
        score.main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "with their signatures, and the Transformer paper's tokenized, compound-split BLEU" in out
    )


def test_prepare_data_help_is_its_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    """prepare_data.py prints its module docstring for --help: every paragraph ends whole."""
    from attnmt.cli import prepare_data

    assert prepare_data.main(["--help"]) == 0
    out = capsys.readouterr().out
    prose = [p for p in out.split("\n\n") if p.strip() and not p.startswith("    ")]
    assert prose
    for paragraph in prose:
        assert cut(paragraph, True) is None, paragraph
