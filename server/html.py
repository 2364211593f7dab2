"""`format: html` for the LibreTranslate API: translate the text between tags, keep the markup.

A small tokenizer of our own (`_tokens`, after the WHATWG tokenizer's rules for where markup
starts and ends) cuts the document into markup and text; it reads each character a bounded
number of times, so its time is linear in the input, whatever the input. Markup is kept byte
for byte as it came: tags (end tags with attributes too), comments (ended by `-->` or `--!>`,
or by the end of the input), `<![CDATA[...]]>`, declarations (`<!DOCTYPE ...>` with its
internal subset `[...]>`, `<!foo>`), processing instructions, and a tag the input ends inside
(up to the end). A `<` that starts no markup (`a < b`, `<3`) is text.

A text node with a letter is one segment to translate; its leading and trailing whitespace
(`&nbsp;`, `&#160;` and `&#xa0;` count as whitespace) is kept around the translation, which is
HTML-escaped; inside it entities are decoded and whitespace collapsed to single spaces. A text
node without a letter (".", "2024", "&nbsp;") is kept as it is. Text inside `script`, `style`,
`code`, `pre`, `textarea`, `noscript`, `template`, `xmp`, `iframe`, `noembed`, `noframes`,
`plaintext` and any element marked `translate="no"` or with the class `notranslate` is kept as
it is. A sentence split by inline tags (`a <b>big</b> dog`) is three segments, as in
LibreTranslate. Torch-free.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import NamedTuple

KEEP_ELEMENTS = {"script", "style", "code", "pre", "textarea", "noscript", "template"}
VOID_ELEMENTS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip
# Elements whose content is not markup, up to their end tag (plaintext: to the end): kept as
# it is, but a title's (RCDATA: its text is translated).
RAW_ELEMENTS = {
    "script", "style", "xmp", "iframe", "noembed", "noframes", "textarea", "title", "plaintext",
}  # fmt: skip
TEXT_ELEMENTS = {"title"}

_SPACE = re.compile(r"[\t\n\f\r ]*")  # HTML's whitespace inside tags
_ATTR_NAME = re.compile(r"[^\t\n\f\r />][^\t\n\f\r />=]*")
_UNQUOTED = re.compile(r"[^\t\n\f\r >]*")
_TAG_NAME = re.compile(r"[a-zA-Z][^\t\n\f\r />]*")
_SIMPLE_TAG = re.compile(r"<(/?)([a-zA-Z][^\t\n\f\r />]*)>")
_COMMENT_END = re.compile(r"--!?>")
_SUBSET_END = re.compile(r"\][\t\n\f\r ]*>")  # a DOCTYPE's internal subset: "[ ... ]>"
_BLANK_ENTITY = r"&nbsp;|&#0{0,4}160;|&#[xX]0{0,4}[aA]0;"  # at most 10 characters
_LEAD = re.compile(rf"(?:\s|{_BLANK_ENTITY})*")
_BLANK = re.compile(_BLANK_ENTITY)


class Token(NamedTuple):
    kind: str  # "text", "start", "end" or "markup" (kept verbatim)
    raw: str  # the input's characters, as they came
    tag: str = ""  # start and end tags: the lower-case name
    keep: bool = False  # a start tag: its content is not translated
    closed: bool = False  # a start tag: self-closing (`<br/>`), no element is opened


class Document:
    """An HTML fragment as markup and text: `segments` to translate, `render(translations)`."""

    def __init__(self, text: str) -> None:
        self._parts: list[str | int] = []  # str: kept verbatim; int: index into segments
        self._spaces: list[tuple[str, str]] = []  # (leading, trailing) of each segment
        self.segments: list[str] = []
        open_elements = _OpenElements()
        for token in _tokens(text):
            if token.kind == "text" and not open_elements.keeping:
                self._text(token.raw)
            else:
                self._parts.append(token.raw)
            if token.kind == "start" and not token.closed and token.tag not in VOID_ELEMENTS:
                open_elements.push(token.tag, token.keep)
            elif token.kind == "end":
                open_elements.close(token.tag)

    def _text(self, raw: str) -> None:
        if "&" not in raw and not raw[0].isspace() and not raw[-1].isspace():  # the usual
            if any(c.isalpha() for c in raw):
                self._parts.append(len(self.segments))
                self.segments.append(" ".join(raw.split()))
                self._spaces.append(("", ""))
            else:
                self._parts.append(raw)
            return
        lead = _LEAD.match(raw).group()  # matches "" at least
        end = _trail_start(raw, len(lead))
        segment = " ".join(html.unescape(raw[len(lead) : end]).split())
        if not any(c.isalpha() for c in segment):  # punctuation, numbers, spaces: kept
            self._parts.append(raw)
            return
        self._parts.append(len(self.segments))
        self.segments.append(segment)
        self._spaces.append((lead, raw[end:]))

    def render(self, translations: list[str]) -> str:
        """The document with segment i replaced by `translations[i]` (escaped)."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        out = []
        for part in self._parts:
            if isinstance(part, int):
                lead, trail = self._spaces[part]
                out.append(lead + html.escape(translations[part], quote=False) + trail)
            else:
                out.append(part)
        return "".join(out)


class _OpenElements:
    """The open elements, with O(1) push, `keeping` and (amortised) close: an end tag closes
    its element and whatever that left open; one with no open element of its name does
    nothing."""

    def __init__(self) -> None:
        self._stack: list[tuple[str, bool]] = []
        self._count: dict[str, int] = {}  # open elements per tag name
        self._keeping = 0  # open elements that keep their text

    @property
    def keeping(self) -> bool:
        return self._keeping > 0

    def push(self, tag: str, keep: bool) -> None:
        self._stack.append((tag, keep))
        self._count[tag] = self._count.get(tag, 0) + 1
        self._keeping += keep

    def close(self, tag: str) -> None:
        if not self._count.get(tag):
            return
        while True:
            name, keep = self._stack.pop()
            self._count[name] -= 1
            self._keeping -= keep
            if name == tag:
                return


def _trail_start(raw: str, start: int) -> int:
    """Where `raw`'s trailing whitespace (and blank entities) begins, not before `start`."""
    end = len(raw)
    while end > start:
        if raw[end - 1].isspace():
            end -= 1
            continue
        amp = raw.rfind("&", max(start, end - 10), end)  # a blank entity: <= 10 characters
        if raw[end - 1] != ";" or amp < 0 or not _BLANK.fullmatch(raw, amp, end):
            return end
        end = amp
    return end


def _tokens(text: str) -> Iterator[Token]:
    """`text` as tokens whose `raw` parts, joined, are `text`; linear time."""
    n, i, start = len(text), 0, 0  # start: where the current text began
    while i < n:
        lt = text.find("<", i)
        if lt < 0:
            break
        tokens = _markup(text, lt)
        if not tokens:  # a "<" that is text
            i = lt + 1
            continue
        if start < lt:
            yield Token("text", text[start:lt])
        yield from tokens
        i = start = lt + sum(len(t.raw) for t in tokens)
    if start < n:
        yield Token("text", text[start:])


def _markup(text: str, lt: int) -> list[Token]:
    """The tokens of the markup starting at `text[lt] == "<"` (a tag and, for an element whose
    content is not markup, that content), or [] when this "<" is text."""
    simple = _SIMPLE_TAG.match(text, lt)  # the usual "<p>", "</p>": no attributes
    if simple and simple.group(2).lower() not in RAW_ELEMENTS:
        tag = simple.group(2).lower()
        kind = "end" if simple.group(1) else "start"
        return [Token(kind, simple.group(), tag, tag in KEEP_ELEMENTS)]
    n, after = len(text), text[lt + 1 : lt + 2]
    if after == "!":
        return [Token("markup", text[lt : _declaration_end(text, lt)])]
    if after == "?":  # a processing instruction: a bogus comment up to ">"
        return [Token("markup", text[lt : _find_end(text, ">", lt + 2)])]
    if after == "/":
        name = _TAG_NAME.match(text, lt + 2)
        if name is None:  # "</>" is dropped by browsers, "</ x>" a bogus comment, "</" text
            if lt + 2 >= n:
                return []
            return [Token("markup", text[lt : _find_end(text, ">", lt + 2)])]
        end, _, _ = _tag_end(text, name.end())
        return [Token("end", text[lt:end], name.group().lower())]
    name = _TAG_NAME.match(text, lt + 1)
    if name is None:
        return []
    tag = name.group().lower()
    end, attributes, closed = _tag_end(text, name.end())
    keep = (
        tag in KEEP_ELEMENTS
        or html.unescape(attributes.get("translate", "")).strip().lower() == "no"
        or "notranslate" in html.unescape(attributes.get("class", "")).split()
    )
    tokens = [Token("start", text[lt:end], tag, keep, closed)]
    if tag == "plaintext":  # everything after it is text, kept
        tokens.append(Token("markup", text[end:]))
    elif tag in RAW_ELEMENTS and end < n:
        close = re.compile(rf"</{re.escape(tag)}[\t\n\f\r />]", re.IGNORECASE).search(text, end)
        stop = close.start() if close else n
        if stop > end:
            kind = "text" if tag in TEXT_ELEMENTS else "markup"
            tokens.append(Token(kind, text[end:stop]))
    return tokens


def _find_end(text: str, what: str, start: int) -> int:
    """Just past the first `what` from `start`, or the end of `text`."""
    found = text.find(what, start)
    return len(text) if found < 0 else found + len(what)


def _declaration_end(text: str, lt: int) -> int:
    """The end of the markup `<!...` at `lt`: a comment (`-->`, `--!>`; `<!-->` and
    `<!--->` end where they are), CDATA (`]]>`), a DOCTYPE with its internal subset, or any
    other declaration up to its first ">"; the end of `text` when it is not closed."""
    if text.startswith("<!--", lt):
        found = _COMMENT_END.search(text, lt + 2)
        return found.end() if found else len(text)
    if text.startswith("<![CDATA[", lt):
        return _find_end(text, "]]>", lt + 9)
    gt = _find_end(text, ">", lt + 2)
    if text[lt + 2 : lt + 9].upper() == "DOCTYPE" and "[" in text[lt:gt]:
        found = _SUBSET_END.search(text, text.index("[", lt))
        return found.end() if found else len(text)
    return gt


def _tag_end(text: str, i: int) -> tuple[int, dict[str, str], bool]:
    """A tag's attributes from `i` (just past its name): (just past its ">" or the end of
    `text`, the attributes (lower-case names, raw values, the first of a name counts), whether
    it ends in "/>"). Each step takes at least one character, so this is linear."""
    n, attributes = len(text), {}
    while True:
        i = _SPACE.match(text, i).end()
        if i >= n:
            return n, attributes, False
        if text[i] == ">":
            return i + 1, attributes, False
        if text[i] == "/":
            if text.startswith(">", i + 1):
                return i + 2, attributes, True
            i += 1
            continue
        name = _ATTR_NAME.match(text, i)
        assert name is not None  # text[i] is neither whitespace, "/" nor ">"
        i, value = name.end(), ""
        j = _SPACE.match(text, i).end()
        if text.startswith("=", j):
            i = _SPACE.match(text, j + 1).end()
            if text[i : i + 1] in ('"', "'"):
                close = text.find(text[i], i + 1)
                if close < 0:  # the input ends inside the value
                    return n, attributes, False
                value, i = text[i + 1 : close], close + 1
            else:
                unquoted = _UNQUOTED.match(text, i)
                value, i = unquoted.group(), unquoted.end()
        attributes.setdefault(name.group().lower(), value)
