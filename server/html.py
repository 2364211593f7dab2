"""`format: html` for the LibreTranslate API: translate the text between tags, keep the markup.

The document is split by the standard library's `html.parser` (the WHATWG-style tokenizer that
ships with Python, kept with it) into markup, kept byte for byte as it came, and text nodes.
Each text node with something other than whitespace is one segment to translate; its leading
and trailing whitespace is kept around the translation, which is HTML-escaped. Text inside
`script`, `style`, `code`, `pre`, `textarea` and any element marked `translate="no"` or with the
class `notranslate` is kept as it is. A sentence split by inline tags (`a <b>big</b> dog`) is
three segments, as in LibreTranslate. Torch-free.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser

KEEP_ELEMENTS = {"script", "style", "code", "pre", "textarea", "noscript", "template"}
VOID_ELEMENTS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip


class Document:
    """An HTML fragment as markup and text: `segments` to translate, `render(translations)`."""

    def __init__(self, text: str) -> None:
        parser = _Splitter()
        parser.feed(text)
        parser.close()
        self._parts = parser.parts  # str: kept verbatim; int: index into segments
        self._spaces = parser.spaces  # (leading, trailing) whitespace of each segment
        self.segments = parser.segments

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


class _Splitter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)  # entities stay in the kept markup as sent
        self.parts: list[str | int] = []
        self.segments: list[str] = []
        self.spaces: list[tuple[str, str]] = []
        self._open: list[tuple[str, bool]] = []  # open elements: (tag, keeps its text)
        self._text: list[str] = []  # raw text (entities unconverted) since the last markup

    def _keeping(self) -> bool:
        return any(keep for _, keep in self._open)

    def _flush(self) -> None:
        raw = "".join(self._text)
        self._text = []
        if not raw:
            return
        core = raw.strip()
        if not core or self._keeping():
            self.parts.append(raw)
            return
        lead, trail = raw[: len(raw) - len(raw.lstrip())], raw[len(raw.rstrip()) :]
        self.parts.append(len(self.segments))
        self.segments.append(" ".join(html.unescape(core).split()))
        self.spaces.append((lead, trail))

    def _markup(self, text: str) -> None:
        self._flush()
        self.parts.append(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup(self.get_starttag_text() or f"<{tag}>")
        if tag not in VOID_ELEMENTS:
            values = dict(attrs)
            keep = (
                tag in KEEP_ELEMENTS
                or (values.get("translate") or "").lower() == "no"
                or "notranslate" in (values.get("class") or "").split()
            )
            self._open.append((tag, keep))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._markup(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        self._flush()
        self.parts.append(f"</{tag}>")
        for i in range(len(self._open) - 1, -1, -1):  # close it and whatever it left open
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_entityref(self, name: str) -> None:
        self._text.append(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self._text.append(f"&#{name};")

    def handle_comment(self, data: str) -> None:
        self._markup(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self._markup(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._markup(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._markup(f"<![{data}]>")

    def close(self) -> None:
        super().close()
        self._flush()
