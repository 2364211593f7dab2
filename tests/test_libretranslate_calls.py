"""What LibreTranslate's clients call besides `/translate`, against a `serve.py` subprocess of
one tiny en->de run: `source: "auto"` (`detectedLanguage`), `POST /detect`, `alternatives`,
`GET /frontend/settings`, `POST /translate_file` (.txt, .html, .docx) with
`GET /download_file`. The unmodified `libretranslatepy` client makes the calls it has
(`translate`, `detect`, `languages`); the rest go over raw HTTP as LibreTranslate's page and
apps send them. What the server answers is compared with `translate.py -c` of the same run;
every bad input is a 4xx with a JSON error, after which the server still translates.
"""

from __future__ import annotations

import io
import json
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_decoding import PAIRS
from tests.test_serve import post, request, serve
from tests.test_serve_api import make_run, metric, translate_py

ENGLISH = [tgt for _, tgt in PAIRS]
GERMAN = [src for src, _ in PAIRS]
LIMITS = ["--max-sentences", "8", "--max-chars", "200", "--max-beam", "4", "--beam", "1"]
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("lt_calls") / "en-de", "en", "de", seed=5)


@pytest.fixture(scope="module")
def server(run: Path) -> Iterator[str]:
    with serve(run, *LIMITS) as served:
        yield served.url


@pytest.fixture(scope="module")
def german(run: Path) -> dict[str, str]:
    """translate.py's translation of each English sentence the tests send."""
    return dict(zip(ENGLISH[:8], translate_py(run, ENGLISH[:8]), strict=True))


def upload(
    url: str, filename: str, data: bytes, fields: dict[str, str] | None = None
) -> tuple[int, Any]:
    """`POST /translate_file` as LibreTranslate's page sends it (multipart: file, source,
    target)."""
    boundary = uuid.uuid4().hex
    fields = {"source": "en", "target": "de"} if fields is None else fields
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    if filename is not None:
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        )
        parts.append(head.encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    req = urllib.request.Request(
        url + "/translate_file",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def download(answer: dict[str, Any]) -> tuple[bytes, str, str]:
    """The translated file at `translatedFileUrl`: (bytes, content type, disposition)."""
    with urllib.request.urlopen(answer["translatedFileUrl"], timeout=60) as response:
        return (
            response.read(),
            response.headers["Content-Type"],
            response.headers["Content-Disposition"],
        )


# ---------------------------------------------------------------- libretranslatepy's calls


def test_libretranslatepy_translate_detect_and_languages(
    server: str, german: dict[str, str]
) -> None:
    """Every call libretranslatepy has works unchanged: translate (named codes in any form,
    and auto), detect, languages."""
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(server)
    sentence = ENGLISH[0]
    for source, target in [("en", "de"), ("eng", "deu"), ("en-US", "de-DE"), ("auto", "de")]:
        assert client.translate(sentence, source, target) == german[sentence], (source, target)
    detected = client.detect(ENGLISH[1])
    assert detected[0]["language"] == "en" and detected[0]["confidence"] > 50, detected
    assert [d["language"] for d in client.detect(GERMAN[1])][:1] == ["de"]
    assert client.languages() == [  # en->de: de is listed too, as a target only
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    with pytest.raises(urllib.error.HTTPError) as error:
        client.translate(sentence, "en", "xx")
    assert error.value.code == 400
    message = json.loads(error.value.read())["error"]
    assert "'xx': no served model has it; languages: en, de" in message, message


# ---------------------------------------------------------------- the calls it does not have


def test_auto_answers_detected_language_per_text(server: str, german: dict[str, str]) -> None:
    texts = ENGLISH[:2]
    status, answer = post(server, "/translate", {"q": texts, "source": "auto", "target": "de"})
    assert status == 200, answer
    assert answer["translatedText"] == [german[t] for t in texts]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "en"]
    assert all(0 < d["confidence"] <= 100 for d in answer["detectedLanguage"])
    # German to German: no model is needed, the text comes back (as from LibreTranslate)
    body = {"q": GERMAN[0], "source": "auto", "target": "de"}
    status, answer = post(server, "/translate", body)
    assert status == 200 and answer["translatedText"] == GERMAN[0], answer
    assert answer["detectedLanguage"]["language"] == "de"


def test_detect_over_http_json_and_errors(server: str) -> None:
    status, found = post(server, "/detect", {"q": GERMAN[2]})
    assert status == 200 and found[0]["language"] == "de"
    assert found == sorted(found, key=lambda d: -d["confidence"])
    assert {d["language"] for d in found} <= {"en", "de"}  # the served languages only
    for body, words in [({}, "missing q"), ({"q": "  "}, "missing q"), ({"q": 3}, "string")]:
        status, answer = post(server, "/detect", body)
        assert status == 400 and words in answer["error"], answer


def test_alternatives_are_the_n_best_per_text(server: str, run: Path) -> None:
    texts = ENGLISH[:2]
    body = {"q": texts, "source": "en", "target": "de", "alternatives": 2}
    status, answer = post(server, "/translate", body)
    assert status == 200, answer
    nbest = translate_py(run, texts, "--beam", "3", "--nbest", "3")
    per_text = [
        [line.split(" ||| ")[1] for line in nbest if line.startswith(f"{i} ")] for i in (0, 1)
    ]
    assert answer["translatedText"] == [found[0] for found in per_text]
    assert answer["alternatives"] == [
        [t for t in found[1:] if t != found[0]] for found in per_text
    ]  # unique, the best left out (LibreTranslate's filter)
    assert all(isinstance(a, str) for alts in answer["alternatives"] for a in alts)


def test_frontend_settings(server: str) -> None:
    status, settings = request(server, "GET", "/frontend/settings")
    assert status == 200
    assert settings == {
        "charLimit": 200,  # --max-chars
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html", ".docx"],
        "limits": {  # serve.py's flags of these names
            "max_sentences": 8,
            "max_chars": 200,
            "max_beam": 4,
            "max_output_tokens": 1024,
            "max_work": 32768,
            "client_timeout": 30.0,
        },
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "de", "name": "German"},
        },
    }


# ---------------------------------------------------------------- translate_file


def test_translate_file_txt_and_html(server: str, german: dict[str, str]) -> None:
    e = ENGLISH
    text = f"{e[0]} {e[1]}\r\n\r\n  {e[2]}\r\n"  # two sentences on a line, CRLF, a blank line
    status, answer = upload(server, "notes.txt", ("\ufeff" + text).encode())
    assert status == 200, answer
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/download_file/[0-9a-f]{32}\.notes\.txt",
                        answer["translatedFileUrl"]), answer  # fmt: skip
    data, kind, disposition = download(answer)
    g = german
    assert data.decode("utf-8") == f"\ufeff{g[e[0]]} {g[e[1]]}\r\n\r\n  {g[e[2]]}\r\n"
    assert kind.startswith("text/plain") and 'filename="notes.txt"' in disposition

    html = f'<html><body><h1 class="t">{e[3]}</h1><p>{e[4]} <b>{e[5]}</b></p></body></html>'
    status, answer = upload(server, "page.html", html.encode(), {"source": "auto", "target": "de"})
    assert status == 200, answer
    data, kind, _ = download(answer)
    h = {s: escape(t, quote=False) for s, t in g.items()}  # text nodes are escaped
    assert data.decode() == (
        f'<html><body><h1 class="t">{h[e[3]]}</h1><p>{h[e[4]]} <b>{h[e[5]]}</b></p></body></html>'
    )
    assert kind.startswith("text/html")


def test_translate_file_docx_keeps_the_documents_structure(
    server: str, german: dict[str, str]
) -> None:
    import docx

    e, g = ENGLISH, german
    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = e[6]
    document.add_heading(e[0], level=1)
    para = document.add_paragraph(style="List Bullet")
    para.add_run(e[1]).bold = True
    para.add_run(" " + e[2]).italic = True
    document.add_paragraph("")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = e[3]
    table.cell(0, 1).paragraphs[0].add_run().add_tab()  # no text: left alone
    document.add_paragraph(e[4])
    source = io.BytesIO()
    document.save(source)

    status, answer = upload(server, "report.docx", source.getvalue())
    assert status == 200, answer
    data, kind, _ = download(answer)
    assert kind == DOCX
    out = docx.Document(io.BytesIO(data))
    paragraphs = out.paragraphs
    assert [p.style.name for p in paragraphs] == [p.style.name for p in document.paragraphs]
    assert [p.text for p in paragraphs] == [g[e[0]], f"{g[e[1]]} {g[e[2]]}", "", g[e[4]]]
    runs = paragraphs[1].runs  # the translation sits in the first run, with its formatting
    assert (runs[0].bold, runs[0].text, runs[1].text) == (True, f"{g[e[1]]} {g[e[2]]}", "")
    cells = out.tables[0].rows[0].cells
    assert (cells[0].text, cells[1].text) == (g[e[3]], "\t")
    assert out.sections[0].header.paragraphs[0].text == g[e[6]]


def test_bad_files_are_400s_and_lose_nothing(server: str, german: dict[str, str]) -> None:
    long_line = "word " * 50  # 250 characters, no sentence end: over --max-chars 200
    many = "".join(f"{ENGLISH[i % 8]} {ENGLISH[(i + 1) % 8]}\n" for i in range(60))
    for filename, data, fields, words in [
        ("empty.txt", b"", None, "file is empty"),
        ("blank.txt", b" \n\n", None, "no text"),
        ("slides.pdf", b"%PDF-1.4", None, "'.pdf' files are not supported; send .txt, .html"),
        ("noext", b"text", None, "without an extension"),
        ("fake.docx", b"not a zip", None, "not a .docx"),
        ("latin1.txt", "Gr\u00fc\u00dfe".encode("latin-1"), None, "not UTF-8"),
        ("long.txt", long_line.encode(), None, "a paragraph of 249 characters, the limit is 200"),
        ("big.txt", many.encode(), None, "the limit is 1600"),
        ("a.txt", b"A man.", {"source": "en", "target": "xx"}, "'xx': no served model"),
        ("a.txt", b"A man.", {"target": "de"}, "missing source"),
        (None, b"", None, "missing file"),
    ]:
        status, answer = upload(server, filename, data, fields)
        assert status == 400 and set(answer) == {"error"}, (filename, answer)
        assert words in answer["error"], (filename, answer)
    status, answer = post(server, "/translate_file", {"source": "en", "target": "de"})
    assert status == 400 and "multipart/form-data" in answer["error"]
    status, answer = request(server, "GET", "/download_file/nope.txt")
    assert status == 404 and "translate the file again" in answer["error"]
    status, answer = upload(server, "ok.txt", ENGLISH[0].encode())
    assert status == 200 and download(answer)[0].decode() == german[ENGLISH[0]]


def test_file_calls_are_counted_in_the_metrics(server: str) -> None:
    before = request(server, "GET", "/metrics")[1].decode()
    status, answer = upload(server, "m.txt", ENGLISH[0].encode())
    assert status == 200
    download(answer)
    text = request(server, "GET", "/metrics")[1].decode()

    def delta(name: str, **labels: str) -> float:
        return metric(text, name, **labels) - metric(before, name, 0.0, **labels)

    assert delta("attnmt_http_requests_total", route="/translate_file", status="200") == 1
    assert delta("attnmt_http_requests_total", route="/download_file/{name}", status="200") == 1
    assert delta("attnmt_translate_requests_total", api="libretranslate") == 1


def test_api_keys_guard_detect_and_translate_file(run: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("key-one\n")
    with serve(run, "--api-keys", str(keys), *LIMITS) as served:
        url = served.url
        assert post(url, "/detect", {"q": ENGLISH[0]})[0] == 403
        assert post(url, "/detect", {"q": ENGLISH[0], "api_key": "key-one"})[0] == 200
        assert upload(url, "a.txt", b"A man.")[0] == 403
        fields = {"source": "en", "target": "de", "api_key": "key-one"}
        status, answer = upload(url, "a.txt", ENGLISH[0].encode(), fields)
        assert status == 200 and download(answer)[0]  # the download needs no key (its name)
        settings = request(url, "GET", "/frontend/settings")[1]
        assert (settings["apiKeys"], settings["keyRequired"]) == (True, True)
        from libretranslatepy import LibreTranslateAPI

        assert LibreTranslateAPI(url, api_key="key-one").detect(ENGLISH[0])[0]["language"] == "en"
