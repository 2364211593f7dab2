"""Files for LibreTranslate's `POST /translate_file`: .txt, .html and .docx read into the texts
a request translates, written back with the translations, and kept for `GET /download_file`.

A .txt file is one text per line (a paragraph); an .html file is one text in
`format: html` (its text nodes, `html.Document`); a .docx file (python-docx, in the serve extra)
is one text per paragraph with text, wherever the paragraph is: the body, tables, text boxes,
headers and footers. A .docx paragraph's text is that of its runs; its translation goes into
its first run with text and the others' text is emptied, so the document keeps every
paragraph, table, style, image, tab and break, and each paragraph the formatting of its first
run. Nothing here raises anything but `FileError` (a 400) for a file it cannot take.
Torch-free.
"""

from __future__ import annotations

import io
import re
import uuid
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

FORMATS = {
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
MAX_FILE_BYTES = 16 * 2**20  # an upload (a .docx with its images)
MAX_UNZIPPED_BYTES = 128 * 2**20  # a .docx's parts, unpacked (no zip bombs)
# A .docx's XML parts, unpacked, as the zip's directory gives their sizes (what the XML
# parser reads: the zip reader stops at those sizes); parsing takes about 35x this memory.
MAX_XML_BYTES = 16 * 2**20
MAX_UPLOADS = 2  # files read, parsed and translated at once (each may take ~0.6 GB)
# The parts of a .docx whose paragraphs are translated.
DOCX_PARTS = re.compile(r"/word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml")
BOM = "\ufeff"


class FileError(ValueError):
    """A file the server cannot translate; the message says why and what to send."""


@dataclass
class Parsed:
    """A file as texts (`fmt` as in `/translate`) and how to write it back."""

    texts: list[str]
    fmt: str  # "text" or "html"
    write: Callable[[list[str]], bytes]  # the translated texts -> the file's bytes


def extension(filename: str) -> str:
    """The file's lower-case extension, checked: one of `FORMATS`."""
    suffix = ("." + filename.rsplit(".", 1)[-1]).lower() if "." in filename else ""
    if suffix not in FORMATS:
        shown = f"{suffix!r} files are" if suffix else "a file without an extension is"
        raise FileError(f"{shown} not supported; send {', '.join(FORMATS)}")
    return suffix


def safe_name(filename: str) -> str:
    """The name a translated file is kept and downloaded as: the upload's base name in
    `[A-Za-z0-9._-]`, not hidden, with its extension checked (`extension`)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", filename.rsplit("/", 1)[-1].rsplit("\\", 1)[-1])
    suffix = extension(safe)
    safe = safe.lstrip(".")[-120:]
    return safe if safe.lower() != suffix[1:] and safe else f"file{suffix}"


def parse_file(filename: str, data: bytes, max_lines: int | None = None) -> Parsed:
    """The texts of an uploaded file; a .txt file may have at most `max_lines` lines (blank
    ones too), counted before it is decoded. Raises FileError: an empty file, an unsupported
    type, a file that is not what its extension says, one without text, or over a limit."""
    suffix = extension(filename)
    if not data:
        raise FileError("the file is empty; send a file with text to translate")
    if suffix == ".docx":
        parsed = _parse_docx(data)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileError(f"the file is not UTF-8 text ({e}); save it as UTF-8") from None
        if suffix == ".txt" and max_lines is not None:
            _check_lines(text, max_lines)
        parsed = _parse_html(text) if suffix == ".html" else _parse_text(text)
    if not any(t.strip() for t in parsed.texts):
        raise FileError("the file has no text to translate")
    return parsed


# What `str.splitlines` breaks a line at ("\r\n" once).
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


def _check_lines(text: str, max_lines: int) -> None:
    """At most `max_lines` lines, blank ones too, counted before the text is split."""
    lines = sum(text.count(c) for c in LINE_BREAKS) - text.count("\r\n") + 1
    if lines > max_lines:
        raise FileError(
            f"the file has {lines} lines, the limit is {max_lines} (serve.py --max-sentences "
            "times --max-chars); send a shorter file"
        )


def _parse_text(text: str) -> Parsed:
    """A .txt file: each line a text; its line ending, a BOM and blank lines kept as they
    are."""
    lines = text.splitlines(keepends=True)
    bodies = [line.rstrip("\r\n") for line in lines]

    def write(translated: list[str]) -> bytes:
        out = [
            tr + line[len(body) :] if body.strip() else line
            for line, body, tr in zip(lines, bodies, translated, strict=True)
        ]
        return "".join(out).encode("utf-8")

    if bodies and bodies[0].startswith(BOM):  # kept outside the text
        bom, bodies[0] = BOM, bodies[0][1:]
        lines[0] = lines[0][1:]
        return Parsed(bodies, "text", lambda translated: bom.encode() + write(translated))
    return Parsed(bodies, "text", write)


def _parse_html(text: str) -> Parsed:
    """An .html file: one text, its text nodes translated (`format: html`)."""
    return Parsed([text], "html", lambda translated: translated[0].encode("utf-8"))


def _parse_docx(data: bytes) -> Parsed:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        raise FileError("the file is not a .docx document (not a zip archive)") from None
    unzipped = sum(info.file_size for info in infos)
    xml = sum(info.file_size for info in infos if info.filename.endswith((".xml", ".rels")))
    for size, limit, what in (
        (unzipped, MAX_UNZIPPED_BYTES, "unpacks to"),
        (xml, MAX_XML_BYTES, "holds XML of"),
    ):
        if size > limit:
            raise FileError(
                f"the .docx {what} {size} bytes, the limit is {limit}; send a smaller document"
            )
    import docx
    from docx.oxml.ns import qn

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - python-docx's and lxml's many errors
        raise FileError(f"the file is not a .docx document ({type(e).__name__})") from None
    paragraphs: list[list[Any]] = []  # per paragraph with text: its w:t elements
    for part in document.part.package.iter_parts():
        element = getattr(part, "element", None)
        if element is None or not DOCX_PARTS.fullmatch(str(part.partname)):
            continue
        for p in element.iter(qn("w:p")):
            runs = [t for t in p.iter(qn("w:t")) if _paragraph_of(t, qn("w:p")) is p]
            if any((t.text or "").strip() for t in runs):
                paragraphs.append(runs)

    def write(translated: list[str]) -> bytes:
        for runs, text in zip(paragraphs, translated, strict=True):
            runs[0].text = text
            runs[0].set(qn("xml:space"), "preserve")  # keep leading/trailing spaces
            for t in runs[1:]:
                t.text = ""
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Parsed(["".join(t.text or "" for t in runs) for runs in paragraphs], "text", write)


def _paragraph_of(element: Any, tag: str) -> Any:
    """The nearest `w:p` around `element` (a text box's paragraphs sit inside another's)."""
    parent = element.getparent()
    while parent is not None and parent.tag != tag:
        parent = parent.getparent()
    return parent


# --- translated files, kept for download -------------------------------------------------------


class Stored(NamedTuple):
    filename: str  # the name it is downloaded as (the upload's, made safe)
    data: bytes
    media_type: str


class FileStore:
    """The translated files, in memory, for `GET /download_file/{name}`: the newest
    `max_files`, at most `max_bytes` together (the oldest are dropped first). A name is a
    random UUID and the file's name, so it cannot be guessed."""

    def __init__(self, max_files: int = 64, max_bytes: int = 256 * 2**20) -> None:
        self.max_files, self.max_bytes = max_files, max_bytes
        self._files: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    def put(self, filename: str, data: bytes) -> str:
        """Keep a translated file; its download name."""
        safe = safe_name(filename)
        name = f"{uuid.uuid4().hex}.{safe}"
        self._files[name] = Stored(safe, data, FORMATS[extension(safe)])
        self._bytes += len(data)
        while len(self._files) > self.max_files or self._bytes > self.max_bytes:
            _, dropped = self._files.popitem(last=False)
            self._bytes -= len(dropped.data)
        return name

    def get(self, name: str) -> Stored | None:
        return self._files.get(name)
