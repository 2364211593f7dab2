"""serve.py for other clients: several models, LibreTranslate's API (through the unmodified
`libretranslatepy` client), HTML, API keys, Prometheus metrics and the OpenAPI document
(fuzzed by Schemathesis). Two tiny models whose checkpoints say different language pairs are
served by one `serve.py -c A -c B` subprocess on 127.0.0.1; what each answers is compared
with `translate.py -c` of its own run. In-process: the language reader, routing, the HTML
splitter and the key buckets.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import pytest

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.common.errors import UserError
from attnmt.data.languages import is_multilingual, language_name, model_languages
from attnmt.decoding.config import SearchConfig
from attnmt.server.batcher import Batcher
from attnmt.server.html import Document
from attnmt.server.keys import KeyRejected, KeyRing
from attnmt.server.libretranslate import language_list
from attnmt.server.service import Limits, RoutingError, ServedModel, Service
from tests.conftest import make_tiny_model
from tests.helpers_decoding import PAIRS, SEARCH_MODEL, tiny_tokenizer
from tests.test_serve import ENV, ROOT, post, request, serve

SOURCES = [src for src, _ in PAIRS]
LIMITS = ["--max-sentences", "8", "--max-chars", "200", "--max-beam", "4"]
LIMITS += ["--max-output-tokens", "64", "--batch-wait-ms", "10"]


def make_run(run_dir: Path, src: str, tgt: str, seed: int) -> Path:
    """A tiny run dir whose training config says `src` -> `tgt`."""
    tokenizer = tiny_tokenizer(run_dir / "spm")
    model = make_tiny_model(vocab_size=tokenizer.src_vocab_size, seed=seed, **SEARCH_MODEL)
    payload = model_payload(model, tokenizer)
    payload["config"] = {"data": {"src_lang": src, "tgt_lang": tgt}}
    payload["train_state"] = {"step": seed}
    save_checkpoint(run_dir / "checkpoints" / "best.pt", payload)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("serve_api")
    return {
        "de-en": make_run(base / "de-en", "de", "en", seed=2),
        "en-de": make_run(base / "en-de", "en", "de", seed=5),
    }


@pytest.fixture(scope="module")
def server(runs: dict[str, Path]) -> Iterator[str]:
    with serve(runs["de-en"], "-c", str(runs["en-de"]), "--beam", "1", *LIMITS) as served:
        yield served.url


def translate_py(run_dir: Path, lines: list[str], *flags: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "translate.py", "-c", str(run_dir), "--beam", "1", *flags, *lines],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


# ---------------------------------------------------------------- several models


def test_models_are_listed_and_routed_by_pair_or_id(server: str, runs: dict[str, Path]) -> None:
    status, listed = request(server, "GET", "/models")
    assert status == 200
    got = [(m["id"], m["source_languages"], m["target_languages"]) for m in listed["models"]]
    assert got == [("de-en", ["de"], ["en"]), ("en-de", ["en"], ["de"])]
    assert request(server, "GET", "/info")[1]["models"] == listed["models"]

    lines = SOURCES[:3]
    expected = {name: translate_py(run, lines) for name, run in runs.items()}
    assert expected["de-en"] != expected["en-de"]  # the two models tell themselves apart
    for body, model in [
        ({}, "de-en"),  # no pair: the first -c, the default
        ({"src_lang": "en", "tgt_lang": "de"}, "en-de"),
        ({"source": "de", "target": "en"}, "de-en"),
        ({"tgt_lang": "de"}, "en-de"),
        ({"model": "en-de"}, "en-de"),
        ({"model": "de-en", "src_lang": "de"}, "de-en"),
    ]:
        status, answer = post(server, "/translate", {"sentences": lines, **body})
        assert status == 200, answer
        assert (answer["model"], answer["translations"]) == (model, expected[model]), body

    for body, words in [
        (
            {"src_lang": "de", "tgt_lang": "fr"},
            ["no model translates de -> fr", "de->en", "en->de"],
        ),
        ({"model": "nope"}, ["unknown model 'nope'", "'en-de'"]),
        ({"model": "en-de", "src_lang": "de"}, ["no source language 'de'"]),
        ({"src_lang": 3}, ["'src_lang' must be a string"]),
    ]:
        status, answer = post(server, "/translate", {"sentences": lines, **body})
        assert status == 422 and all(w in answer["error"] for w in words), answer
    status, attn = post(server, "/attention", {"sentence": lines[0], "model": "en-de"})
    assert status == 200 and attn["translation"] == expected["en-de"][0]


def test_one_batching_queue_per_model(server: str) -> None:
    """Requests for both models at once: each answered by its own model, in order."""
    import threading

    bodies = [
        {"sentences": SOURCES[i : i + 2], "model": ["de-en", "en-de"][i % 2]} for i in range(12)
    ]
    expected = [post(server, "/translate", body)[1]["translations"] for body in bodies]
    got: list[Any] = [None] * len(bodies)

    def send(i: int) -> None:
        got[i] = post(server, "/translate", bodies[i])[1]["translations"]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == expected


# ---------------------------------------------------------------- LibreTranslate


def test_libretranslatepy_translates_through_the_server(server: str, runs: dict[str, Path]) -> None:
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(server)
    sentence = SOURCES[0]
    assert client.translate(sentence, "de", "en") == translate_py(runs["de-en"], [sentence])[0]
    assert client.translate(sentence, "en", "de") == translate_py(runs["en-de"], [sentence])[0]
    assert client.languages() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]
    with pytest.raises(urllib.error.HTTPError) as error:
        client.translate(sentence, "de", "fr")
    assert error.value.code == 400
    message = json.loads(error.value.read())["error"]
    assert "no model translates de -> fr" in message and "de->en" in message


def test_libretranslate_json_lists_lines_alternatives_and_auto(
    server: str, runs: dict[str, Path]
) -> None:
    texts = [SOURCES[0], f"{SOURCES[1]}\n{SOURCES[2]}"]  # a text of two lines: two sentences
    status, answer = post(server, "/translate", {"q": texts, "source": "de", "target": "en"})
    assert status == 200, answer
    lines = translate_py(runs["de-en"], SOURCES[:3])
    assert answer == {"translatedText": [lines[0], f"{lines[1]}\n{lines[2]}"]}

    body = {"q": SOURCES[0], "source": "de", "target": "en", "alternatives": 2}
    status, answer = post(server, "/translate", body)
    nbest = translate_py(runs["de-en"], SOURCES[:1], "--beam", "3", "--nbest", "3")
    texts3 = [line.split(" ||| ")[1] for line in nbest]
    assert status == 200 and answer["alternatives"] == texts3[1:], answer
    assert answer["translatedText"] == texts3[0]

    english = PAIRS[0][1]  # auto: detected among the served languages (de, en)
    status, answer = post(server, "/translate", {"q": english, "source": "auto", "target": "de"})
    assert status == 200 and answer["detectedLanguage"]["language"] == "en", answer
    assert answer["translatedText"] == translate_py(runs["en-de"], [english])[0]


def test_libretranslate_html_keeps_the_markup(server: str, runs: dict[str, Path]) -> None:
    html = (
        f'<p class="x">{SOURCES[0]} <b>{SOURCES[1]}</b></p>\n<br/>'
        f'<script>var s = "{SOURCES[2]}";</script><span translate="no">{SOURCES[3]}</span>'
        "<!-- note -->"
    )
    body = {"q": html, "source": "de", "target": "en", "format": "html"}
    status, answer = post(server, "/translate", body)
    assert status == 200, answer
    t = [escape(text, quote=False) for text in translate_py(runs["de-en"], SOURCES[:2])]
    assert answer["translatedText"] == (
        f'<p class="x">{t[0]} <b>{t[1]}</b></p>\n<br/>'
        f'<script>var s = "{SOURCES[2]}";</script><span translate="no">{SOURCES[3]}</span>'
        "<!-- note -->"
    )


def test_a_libretranslate_json_body_without_q_gets_libretranslates_error(server: str) -> None:
    for body in ({"source": "de", "target": "en"}, {"target": "en", "format": "html"}):
        status, answer = post(server, "/translate", body)
        assert (status, answer) == (400, {"error": "Invalid request: missing q parameter"})
    status, answer = post(server, "/translate", {})  # neither API's fields: ours
    assert status == 400 and "'sentences' must be a list of strings" in answer["error"], answer
    ours = {"sentences": SOURCES[:1], "source": "de", "target": "en"}  # our aliases
    assert post(server, "/translate", ours)[0] == 200


def test_extreme_sampling_values_the_schema_accepts_answer_200(server: str) -> None:
    for options in ({"temperature": 1e-300}, {"topp": 1e-300}, {"temperature": 1e300}):
        body = {"sentences": SOURCES[:2], "sampling": True, "nbest": 2, **options}
        status, answer = post(server, "/translate", body)
        assert status == 200 and len(answer["translations"]) == 2, answer


def form(url: str, fields: list[tuple[str, str]], multipart: bool = False) -> tuple[int, Any]:
    if multipart:
        boundary = "XyZ123"
        data = (
            "".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                for k, v in fields
            )
            + f"--{boundary}--\r\n"
        )
        kind = f"multipart/form-data; boundary={boundary}"
    else:
        from urllib.parse import urlencode

        data, kind = urlencode(fields), "application/x-www-form-urlencoded"
    req = urllib.request.Request(
        url + "/translate", data=data.encode(), headers={"Content-Type": kind}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_libretranslate_forms_and_its_error_answers(server: str, runs: dict[str, Path]) -> None:
    expected = translate_py(runs["de-en"], SOURCES[:2])
    fields = [("q", SOURCES[0]), ("source", "de"), ("target", "en")]
    assert form(server, fields) == (200, {"translatedText": expected[0]})
    assert form(server, fields, multipart=True) == (200, {"translatedText": expected[0]})
    two = [*fields, ("q", SOURCES[1])]  # repeated q: a list
    assert form(server, two) == (200, {"translatedText": expected})
    for fields, words in [
        ([("source", "de"), ("target", "en")], "missing q parameter"),
        ([("q", "x"), ("target", "en")], "missing source parameter"),
        ([("q", "x"), ("source", "de"), ("target", "en"), ("format", "pdf")], "pdf format"),
        ([("q", "x"), ("source", "de"), ("target", "en"), ("alternatives", "9")], "alternatives"),
        ([("q", "x"), ("source", "xx"), ("target", "en")], "no model translates xx -> en"),
        ([("q", "a\n" * 9), ("source", "de"), ("target", "en")], "limit is 8"),
    ]:
        status, answer = form(server, fields)
        assert status == 400 and set(answer) == {"error"} and words in answer["error"], answer
    status, answer = post(server, "/translate", {"q": 5, "source": "de", "target": "en"})
    assert status == 400 and "string or a list" in answer["error"]


# ---------------------------------------------------------------- metrics, OpenAPI


def metric(text: str, name: str, missing: float | None = None, **labels: str) -> float:
    """The value of one sample of the Prometheus text `text` (`missing` if it has none)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    if missing is not None:
        return missing
    raise AssertionError(f"no {name} {labels} in the metrics")


def test_metrics_count_requests_batches_sentences_and_tokens_per_model(server: str) -> None:
    before = request(server, "GET", "/metrics")[1].decode()
    post(server, "/translate", {"sentences": SOURCES[:3], "model": "en-de"})
    post(server, "/translate", {"sentences": ["a"] * 99})  # 413
    status, raw = request(server, "GET", "/metrics")
    text = raw.decode()
    assert status == 200
    delta = {
        name: metric(text, name, **labels) - metric(before, name, 0.0, **labels)
        for name, labels in [
            ("attnmt_sentences_translated_total", {"model": "en-de"}),
            ("attnmt_batch_sentences_count", {"model": "en-de"}),
            ("attnmt_http_requests_total", {"route": "/translate", "status": "413"}),
        ]
    }
    assert delta == {
        "attnmt_sentences_translated_total": 3,
        "attnmt_batch_sentences_count": 1,
        "attnmt_http_requests_total": 1,
    }
    assert metric(text, "attnmt_tokens_translated_total", model="en-de", side="target") > 0
    assert metric(text, "attnmt_queue_depth", model="de-en") == 0
    assert metric(text, "attnmt_http_request_duration_seconds_count", route="/translate") > 0
    request(server, "GET", "/no/such/path")
    text = request(server, "GET", "/metrics")[1].decode()
    assert metric(text, "attnmt_http_requests_total", route="other", status="404") >= 1


def test_openapi_document_lists_the_routes_and_the_options(server: str) -> None:
    status, doc = request(server, "GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert set(doc["paths"]) >= {"/translate", "/languages", "/models", "/metrics", "/health"}
    body = doc["paths"]["/translate"]["post"]["requestBody"]["content"]
    ours, lt = body["application/json"]["schema"]["oneOf"]
    assert set(ours["properties"]) >= set(SearchConfig.__dataclass_fields__) - {"batch_size"}
    assert ours["properties"]["beam_size"]["maximum"] == 4
    assert ours["properties"]["sentences"]["maxItems"] == 8
    assert lt["required"] == ["q", "source", "target"]
    assert "application/x-www-form-urlencoded" in body


SCHEMATHESIS_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "429"]
"""


@pytest.mark.slow
def test_schemathesis_finds_no_failure_and_the_server_keeps_serving(
    server: str, tmp_path: Path
) -> None:
    """Schemathesis against the document, every check but positive_data_acceptance (the
    document cannot say that nbest <= beam_size, nor the output budget, which depends on the
    text): exit 0, then a translation. A 413 (over a size limit) counts as a rejection."""
    (tmp_path / "schemathesis.toml").write_text(SCHEMATHESIS_CONFIG)
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{server}/openapi.json",
        "--checks", "all", "--exclude-checks", "positive_data_acceptance",
        "--max-examples", "30", "--seed", "1", "--workers", "1",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]  # fmt: skip
    # One worker: with two, hypothesis's ast.parse of a strategy's lambda raced in CPython 3.11
    # ("SystemError: AST constructor recursion depth mismatch") and schemathesis exited 1.
    done = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    print(*[line for line in done.stdout.splitlines() if "generated" in line.lower()], sep="\n")
    assert post(server, "/translate", {"sentences": SOURCES[:1]})[0] == 200


# ---------------------------------------------------------------- API keys


def test_api_keys_403_without_a_good_key_429_past_the_cap_and_never_logged(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# key [requests per minute]\nsecret-key-one 3\nsecret-key-two\n")
    with serve(runs["de-en"], "--api-keys", str(keys), "--beam", "1") as served:
        url = served.url
        body = {"sentences": SOURCES[:1]}
        assert post(url, "/translate", body)[0] == 403
        assert post(url, "/translate", {**body, "api_key": "wrong"})[0] == 403
        lt = {"q": SOURCES[0], "source": "de", "target": "en", "api_key": "secret-key-one"}
        statuses = [post(url, "/translate", lt)[0] for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        status, answer = post(url, "/translate", {**body, "api_key": "secret-key-two"})
        assert status == 200 and answer["translations"]
        from libretranslatepy import LibreTranslateAPI

        assert LibreTranslateAPI(url, api_key="secret-key-two").translate(SOURCES[0], "de", "en")
        with pytest.raises(urllib.error.HTTPError) as error:
            LibreTranslateAPI(url, api_key="nope").translate(SOURCES[0], "de", "en")
        assert error.value.code == 403
        metrics = request(url, "GET", "/metrics")[1].decode()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=60) == 0
        err = served.process.stderr.read()
    assert "stopped after answering" in err  # what the server logged, read whole
    for text in (metrics, err):
        assert "secret-key" not in text


def test_a_bad_key_file_is_a_one_line_error(runs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "keys.txt"
    bad.write_text("k1 fast\n")
    for path, words in [(bad, "line 1"), (tmp_path / "none.txt", "cannot read")]:
        done = subprocess.run(
            [sys.executable, "serve.py", "-c", str(runs["de-en"]), "--api-keys", str(path),
             "--port", "0"],
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and words in lines[0], done.stderr


def test_key_buckets_refill_at_the_cap_per_minute() -> None:
    now = [0.0]
    ring = KeyRing({"k": (2.0, 1)}, clock=lambda: now[0])
    ring.check("k")
    ring.check("k")
    with pytest.raises(KeyRejected) as error:
        ring.check("k")
    assert error.value.status == 429
    now[0] = 30.0  # half a minute: one more request
    ring.check("k")
    with pytest.raises(KeyRejected):
        ring.check("k")
    for key in (None, "", "x", 3):
        with pytest.raises(KeyRejected) as error:
            ring.check(key)
        assert error.value.status == 403
    with pytest.raises(UserError):
        KeyRing.from_file("/nonexistent/keys", 60)


# ---------------------------------------------------------------- in-process: languages, routing, HTML


def test_model_languages_from_a_run_config_or_an_imported_models_list() -> None:
    run = {"config": {"data": {"src_lang": "en", "tgt_lang": "de"}}}
    assert model_languages(run) == (["en"], ["de"])
    nllb = {**run, "languages": {"source": ["eng_Latn", "deu_Latn"], "target": ["fra_Latn"]}}
    assert model_languages(nllb) == (["eng_Latn", "deu_Latn"], ["fra_Latn"])
    assert model_languages({}) == ([], [])
    assert is_multilingual(["eng_Latn", "deu_Latn"], ["fra_Latn"])
    assert not is_multilingual(["en"], ["de"])
    assert (language_name("de"), language_name("eng_Latn"), language_name("xx")) == (
        "German", "English", "xx"
    )  # fmt: skip


def test_a_multilingual_model_is_handed_the_requested_pair_a_bilingual_one_none() -> None:
    calls: list[tuple] = []

    def translate(cfg: Any, sentences: list[str], prefixes: list[str], langs: tuple) -> list:
        calls.append(langs)
        return [[(s, 0.0)] for s in sentences]

    def served(model_id: str, sources: list[str], targets: list[str]) -> ServedModel:
        batcher = Batcher(translate, lambda *a: None, 8, 0.0, 8)
        return ServedModel(model_id, sources, targets, batcher, lambda s: 1)

    bilingual = served("bi", ["en"], ["de"])
    multi = served("multi", ["eng_Latn", "deu_Latn"], ["fra_Latn", "eng_Latn"])
    service = Service([bilingual, multi], SearchConfig(), Limits(8, 100, 4, 64))
    assert service.route(None, "en", "de") == (bilingual, (None, None))
    assert service.route(None, "deu_Latn", "fra_Latn") == (multi, ("deu_Latn", "fra_Latn"))
    assert service.route("multi", "eng_Latn", "fra_Latn")[1] == ("eng_Latn", "fra_Latn")
    with pytest.raises(RoutingError, match="multilingual"):
        service.route("multi", None, None)
    # any form of a code reaches the model's own: en is eng_Latn, fr-FR fra_Latn
    assert service.route(None, "en", "fr-FR") == (multi, ("eng_Latn", "fra_Latn"))
    with pytest.raises(RoutingError, match="no model translates en -> cs .'cs': no served"):
        service.route(None, "en", "cs")
    from attnmt.server.batcher import Job

    for model, langs in [(multi, ("deu_Latn", "fra_Latn")), (bilingual, (None, None))]:
        model.batcher.submit(Job(SearchConfig(), ["x"], langs=langs)).result(timeout=10)
        model.batcher.close()
    assert calls == [("deu_Latn", "fra_Latn"), (None, None)]
    codes = {lang["code"]: lang["targets"] for lang in language_list(service)}
    assert codes == {"en": ["de", "fr"], "de": ["fr", "en"], "fr": []}  # ISO 639-1, merged


def test_html_documents_keep_their_markup_and_translate_text_nodes() -> None:
    source = (
        '<!DOCTYPE html><p class="a" data-x="1 &amp; 2">Hello &amp; <b>big</b>\n world!</p>'
        '<img src="x.png" alt="Keep"><script>if (a < b) x = "<b>";</script>'
        '<div class="notranslate">Keep <i>this</i></div><code>f(x)</code>'
        "<!-- a comment --><p>unclosed &lt;tag&gt;"
    )
    doc = Document(source)
    assert doc.segments == ["Hello &", "big", "world!", "unclosed <tag>"]
    out = doc.render(["Hallo & Co", "groß", "Welt!", "offen <Tag>"])
    assert out == source.replace("Hello &amp; ", "Hallo &amp; Co ").replace(
        ">big<", ">groß<"
    ).replace("world!", "Welt!").replace("unclosed &lt;tag&gt;", "offen &lt;Tag&gt;")
    assert Document("").segments == [] and Document("<br>  \n").render([]) == "<br>  \n"
    with pytest.raises(ValueError):
        doc.render([])
