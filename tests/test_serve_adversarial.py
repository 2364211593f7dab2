"""The adversarial suite: serve.py on a tiny model gets every hostile input of the server's
robustness review (n-best and sample bombs, a .docx memory bomb, quadratic markup, a file of
blank lines, huge glossary terms and forms, a long decode whose client leaves, a huge
attention, slow and half-sent requests), then a normal request, which is answered correctly
and promptly. `hostile_inputs` is shared with the before/after measurement (docs/serving.md)."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.test_serve import make_tiny_run, request, serve

NORMAL = {"sentences": ["ein kleiner Test ."]}
# The answer to the normal request after the last hostile one: within this many seconds.
PROMPT_S = 1.0
# Inputs that are valid and translate (200): extreme sampling values, malformed markup kept as
# text, a glossary whose source folds to another spelling.
VALID = {"file named .txt", "temperature 1e-300", "topp 1e-300", "html <![ x", "glossary İ"}


class Hostile(NamedTuple):
    name: str
    path: str
    body: Callable[[], bytes]  # made when sent (some are large)
    kind: str = "application/json"


def js(value: Any) -> Callable[[], bytes]:
    return lambda: json.dumps(value).encode()


def form_fields(pairs: list[tuple[str, str]]) -> Callable[[], bytes]:
    from urllib.parse import urlencode

    return lambda: urlencode(pairs).encode()


def docx_bomb(xml_bytes: int = 120 * 2**20) -> bytes:
    """A .docx of some 400 KB (python-docx's blank document) whose document.xml unpacks to
    `xml_bytes` of paragraphs (under the 128 MiB unzip cap)."""
    import docx

    blank = io.BytesIO()
    docx.Document().save(blank)
    paragraph = b"<w:p><w:r><w:t>A man rides a bike.</w:t></w:r></w:p>"
    with zipfile.ZipFile(blank) as source:
        parts = {name: source.read(name) for name in source.namelist()}
    head, tail = parts["word/document.xml"].split(b"<w:body>")
    parts["word/document.xml"] = b"".join(
        [head, b"<w:body>", paragraph * (xml_bytes // len(paragraph)), tail]
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return out.getvalue()


def upload(filename: str, make: Callable[[], bytes], pair: tuple[str, str]) -> Callable[[], bytes]:
    def body() -> bytes:
        head = "".join(
            f'--B\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
            for k, v in zip(("source", "target"), pair, strict=True)
        )
        file = f'--B\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n\r\n'
        return (head + file).encode() + make() + b"\r\n--B--\r\n"

    return body


MULTIPART = "multipart/form-data; boundary=B"
ONE = ["A man rides a bike."]


def hostile_inputs(source: str, target: str, nbest: int = 100_000) -> list[Hostile]:
    """The review's hostile requests, for a model of `source` -> `target` (`nbest`: the
    sampled n-best bomb's size)."""
    pair = (source, target)
    return [
        Hostile("nbest 100000", "/translate", js({"sentences": ONE, "sampling": True, "nbest": nbest})),  # noqa: E501
        Hostile("nbest 2^62", "/translate", js({"sentences": ONE, "sampling": True, "nbest": 2**62})),
        Hostile("temperature 1e-300", "/translate", js({"sentences": ONE, "sampling": True, "temperature": 1e-300})),  # noqa: E501
        Hostile("topp 1e-300", "/translate", js({"sentences": ONE, "sampling": True, "topp": 1e-300})),
        Hostile("16 x beam 4 x max_len_b 1024", "/translate", js({"sentences": ONE * 16, "beam_size": 4, "max_len_a": 0, "max_len_b": 1024})),  # noqa: E501
        Hostile("attention 1 KB", "/attention", js({"sentence": "a " * 400, "max_len_b": 500})),
        Hostile("html <a x 30000", "/translate", js({"q": "<a " * 30_000, "source": source, "target": target, "format": "html"})),  # noqa: E501
        Hostile("html <b>x x 20000", "/translate", js({"q": "<b>x" * 20_000, "source": source, "target": target, "format": "html"})),  # noqa: E501
        Hostile("html <![ x", "/translate", js({"q": "<![ x", "source": source, "target": target, "format": "html"})),  # noqa: E501
        Hostile("glossary 3 x 2000 chars", "/translate", js({"sentences": ["a b c"], "glossary": {w: "x" * 2000 for w in "abc"}})),  # noqa: E501
        Hostile("glossary İ", "/translate", js({"sentences": ["I love İstanbul."], "glossary": {"Istanbul": "Istanbul"}})),  # noqa: E501
        Hostile("form 100k q", "/translate", form_fields([("q", "x")] * 100_000 + [("source", source), ("target", target)]), "application/x-www-form-urlencoded"),  # noqa: E501
        Hostile(".docx bomb 120 MiB", "/translate_file", upload("bomb.docx", docx_bomb, pair), MULTIPART),
        Hostile(".txt 16 MiB blank lines", "/translate_file", upload("blank.txt", lambda: b"A man.\n" + b"\n" * (16 * 2**20 - 4096), pair), MULTIPART),  # noqa: E501
        Hostile("file named .txt", "/translate_file", upload(".txt", lambda: b"A man.\n", pair), MULTIPART),
    ]  # fmt: skip


def send(url: str, hostile: Hostile, timeout: float = 120) -> int:
    """The status of one hostile request (0: the connection failed)."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", hostile.path, hostile.body(), {"Content-Type": hostile.kind})
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return 0
    finally:
        conn.close()


def leave_during(url: str, body: dict, seconds: float) -> None:
    """Send `body` to /translate, then close the connection after `seconds` unanswered."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        head = f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"  # noqa: E501
        sock.sendall(head.encode() + data)
        sock.settimeout(seconds)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # no answer yet: the decode is long


def half_sent(url: str, n: int, body: bool) -> list[socket.socket]:
    """`n` connections that send part of a request (its head, or its head and part of its
    body) and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)))
        if body:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        else:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(sock)
    return socks


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (after an answer or none) within `within` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except (TimeoutError, OSError):
        return False
    finally:
        sock.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("adversarial_run"))


@pytest.mark.slow
def test_no_hostile_input_takes_the_server_down(run_dir: Path) -> None:
    with serve(run_dir, "--client-timeout", "2") as served:
        url = served.url
        status, expected = request(url, "POST", "/translate", NORMAL)
        assert status == 200
        hostile = hostile_inputs("de", "en")  # the test model's pair
        statuses = {h.name: send(url, h) for h in hostile}
        bombs = [threading.Thread(target=send, args=(url, hostile[-3])) for _ in range(2)]
        for thread in bombs:  # two memory bombs at once
            thread.start()
        for thread in bombs:
            thread.join()
        # a long decode (within the limits) whose client leaves: cancelled between steps
        long = {"sentences": ONE * 8, "beam_size": 4, "max_len_a": 0, "max_len_b": 1000}
        leave_during(url, long, 1.0)  # 32,000 tokens of work: within --max-work
        slow = half_sent(url, 20, body=True) + half_sent(url, 20, body=False)
        assert all(closed(sock, 30) for sock in slow)  # --client-timeout 2
        began = time.monotonic()
        status, answer = request(url, "POST", "/translate", NORMAL)
        took = time.monotonic() - began
        assert status == 200 and answer == expected
        health = request(url, "GET", "/health")[1]
        assert health["in_flight"] == 0
        assert served.process.poll() is None
    assert {n: s for n, s in statuses.items() if n in VALID} == dict.fromkeys(VALID, 200)
    assert all(400 <= s < 500 for n, s in statuses.items() if n not in VALID), statuses
    assert took < PROMPT_S
