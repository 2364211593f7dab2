"""Library code states why, not when or where it was measured: no commit hash, date or CPU model
in the installed packages' comments and docstrings. Measurements and their history live in
docs/ (docs/benchmarks.md), which a comment links to."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.test_layout import PACKAGES, ROOT, package_files

# 7-40 hex digits with at least one letter and one digit: a commit hash, short or full
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
DATE = re.compile(rf"\b(?:(?:19|20)\d\d-\d\d-\d\d|{MONTH} (?:\d{{1,2}},? )?(?:19|20)\d\d)\b")
CPU = re.compile(
    r"\b(?:Xeon|EPYC|Ryzen|Threadripper|Zen ?[1-6]|Core i[3579]|Graviton\d?|Skylake|Cascade Lake"
    r"|Ice Lake|Sapphire Rapids|Apple M[1-4]|Neoverse)\b"
)
RULES = {"a commit hash": HASH, "a date": DATE, "a CPU model": CPU}


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((value.lineno, value.value))
    return found


def hits() -> dict[str, list[str]]:
    by_file: dict[str, list[str]] = {}
    for path in [ROOT / "attnmt" / "__init__.py"] + [
        p for package in PACKAGES for p in package_files(package)
    ]:
        name = str(path.relative_to(ROOT))
        for line, text in comments_and_docstrings(path):
            for what, rule in RULES.items():
                for match in rule.finditer(text):
                    by_file.setdefault(name, []).append(f"{name}:{line}: {what} {match[0]!r}")
    return by_file


def test_no_measurement_history_in_the_packages() -> None:
    wrong = [hit for lines in hits().values() for hit in lines]
    assert not wrong, "state the why and link docs/benchmarks.md instead:\n" + "\n".join(wrong)


def test_the_rules_catch_what_they_name() -> None:
    assert HASH.search("measured at 5a43175 on main") and not HASH.search("decoded 1234567 ok")
    assert not HASH.search("a deadbeef value") and HASH.search("f2e9e44")
    assert DATE.search("(2026-11-29)") and DATE.search("in Nov 2026") and not DATE.search("2026")
    assert CPU.search("an AMD EPYC 7763") and CPU.search("on Zen 3") and CPU.search("Xeon")


CITED = re.compile(r"(docs/\w+\.md), \"([^\"]+)\"")


def test_the_cited_sections_exist() -> None:
    """A comment's `docs/NAME.md, "Title"` names a heading or paragraph title of that page."""
    wrong = []
    for path in [p for package in PACKAGES for p in package_files(package)]:
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))
        for page, title in CITED.findall(text):
            doc = " ".join((ROOT / page).read_text(encoding="utf-8").split())
            if title not in doc:
                wrong.append(f"{path.relative_to(ROOT)} cites {page}, {title!r}: not there")
    assert not wrong, "\n".join(wrong)
