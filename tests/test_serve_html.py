"""`format: html`'s splitter (`server.html`) in-process: markup byte for byte, text nodes without
letters kept, `&nbsp;` kept, and time linear in the input (counted, not timed)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from attnmt.server import html as splitter
from attnmt.server.html import Document
from tests.test_serve import ENV, ROOT


def bracketed(source: str) -> tuple[list[str], str]:
    """(the segments, the document with each segment "[segment]")."""
    doc = Document(source)
    return doc.segments, doc.render([f"[{s}]" for s in doc.segments])


@pytest.mark.parametrize(
    ("source", "segments", "rendered"),
    [
        ("<!-- note --!><p>Hi</p>", ["Hi"], "<!-- note --!><p>[Hi]</p>"),
        ("<!-->a<!--->b<!-- x", ["a", "b"], "<!-->[a]<!--->[b]<!-- x"),
        ("<![CDATA[ x ]]><p>Hi</p>", ["Hi"], "<![CDATA[ x ]]><p>[Hi]</p>"),
        ("<p>Hi</p class=x>", ["Hi"], "<p>[Hi]</p class=x>"),
        ("<!foo><p>Dog</p>", ["Dog"], "<!foo><p>[Dog]</p>"),
        ('<!DOCTYPE d [ <!ENTITY a "b"> ]>Man', ["Man"], '<!DOCTYPE d [ <!ENTITY a "b"> ]>[Man]'),
        ("<?xml version='1.0'?>Yes", ["Yes"], "<?xml version='1.0'?>[Yes]"),
        ("</>a</ 3>b", ["a", "b"], "</>[a]</ 3>[b]"),
        ('<a href="x>y" title=it\'s>go</a>', ["go"], '<a href="x>y" title=it\'s>[go]</a>'),
        ("<![ x", [], "<![ x"),  # an unclosed declaration: kept to the end, no error
        ("Hi <p class='a", ["Hi"], "[Hi] <p class='a"),  # the input ends inside a tag
        ("a < b, 3<4 <", ["a < b, 3<4 <"], "[a &lt; b, 3&lt;4 &lt;]"),  # "<" as text
        ("<title>A &amp; B</title>", ["A & B"], "<title>[A &amp; B]</title>"),
        ("<xmp><b>x</b></xmp>y", ["y"], "<xmp><b>x</b></xmp>[y]"),
        ('<p translate="NO">No <i>x</i></p>Go', ["Go"], '<p translate="NO">No <i>x</i></p>[Go]'),
    ],
)
def test_markup_comes_back_byte_for_byte(source: str, segments: list[str], rendered: str) -> None:
    assert bracketed(source) == (segments, rendered)


def test_text_nodes_without_letters_and_blank_entities_are_kept() -> None:
    source = "<p>A man <b>rides a bike</b>.</p><p>2024</p><td>&nbsp;</td><p> , </p>"
    assert bracketed(source) == (
        ["A man", "rides a bike"],
        "<p>[A man] <b>[rides a bike]</b>.</p><p>2024</p><td>&nbsp;</td><p> , </p>",
    )
    source = "<p>&nbsp;Hello&#160;world&#xA0; </p>"  # inside a node: a space, as from split
    assert bracketed(source) == (["Hello world"], "<p>&nbsp;[Hello world]&#xA0; </p>")


def _line_events(source: str) -> int:
    """Python lines `server.html` runs to split `source` (a deterministic count of its work)."""
    counts: Counter[str] = Counter()

    def trace(frame, event, arg):  # noqa: ANN001, ANN202
        if frame.f_code.co_filename == splitter.__file__:
            counts[event] += 1
        return trace

    sys.settrace(trace)
    try:
        Document(source)
    finally:
        sys.settrace(None)
    return counts["line"]


@pytest.mark.parametrize("unit", ["<a ", "<b>x", "</a ", '<a b="', "<!--", "<p>x</q>", "<i>"])
def test_the_work_grows_linearly_with_the_input(unit: str) -> None:
    small, large = _line_events(unit * 500), _line_events(unit * 5000)
    assert large <= 11 * small, (small, large)  # quadratic: 100x


def test_inputs_that_froze_the_server_are_split_at_a_size_where_quadratic_is_100x() -> None:
    # 300,000 x "<a " and 200,000 x "<b>x": 10x the sizes that took 41 s and 3 s in
    # html.parser (its quadratic scans are inside regular expressions, not counted above);
    # linear, they take about a second here, quadratic hours
    code = (
        "from attnmt.server.html import Document\n"
        "assert Document('<a ' * 300_000).segments == []\n"
        "assert len(Document('<b>x' * 200_000).segments) == 200_000\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()
