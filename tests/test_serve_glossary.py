"""serve.py with terminology: a request's `glossary` on our API and on LibreTranslate's (JSON,
form, /translate_file), the default glossary of `serve.py --glossary [ID=]FILE` and how a
request's entries override it, bad glossaries answered 4xx while the server keeps serving,
and a bad default glossary as a one-line error at start-up. Over real HTTP: one `serve.py`
subprocess with two tiny models (de-en with a default glossary, en-de without). In-process:
the batcher's routing of glossary jobs and the `--glossary` values.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary, uses_term
from attnmt.server.batcher import Batcher, Job
from tests.test_libretranslate_calls import download, upload
from tests.test_serve import ENV, ROOT, post, serve
from tests.test_serve_api import LIMITS, form, make_run

BIKE = "Ein Mann fährt Fahrrad."  # "Mann": the default glossary's term; "Fahrrad": requests'
DOGS = "Zwei Hunde spielen im Park."  # no term of any glossary here
COFFEE = "Der Mann trinkt Kaffee."
# Target terms the random tiny models never write on their own.
TERM = {"Fahrrad": "Vierbeiner"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("serve_glossary")
    return {
        "de-en": make_run(base / "de-en", "de", "en", seed=2),
        "en-de": make_run(base / "en-de", "en", "de", seed=5),
    }


@pytest.fixture(scope="module")
def server(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    default = tmp_path_factory.mktemp("glossary") / "default.tsv"
    default.write_text("Mann\tKerl\n", encoding="utf-8")
    flags = ["-c", str(runs["en-de"]), "--glossary", f"de-en={default}", "--beam", "1"]
    with serve(runs["de-en"], *flags, *LIMITS) as served:  # greedy: streams for plain jobs
        yield served.url


def ours(url: str, sentences: list[str], **fields: Any) -> list[str]:
    status, answer = post(url, "/translate", {"sentences": sentences, **fields})
    assert status == 200, answer
    return answer["translations"]


def libre(url: str, q: Any, **fields: Any) -> Any:
    status, answer = post(url, "/translate", {"q": q, "source": "de", "target": "en", **fields})
    assert status == 200, answer
    return answer["translatedText"]


# ---------------------------------------------------------------- over HTTP


def test_a_request_glossary_puts_its_terms_in_the_translation_on_our_api(server: str) -> None:
    plain = ours(server, [BIKE, DOGS])
    assert not any("Vierbeiner" in t or "Fahrrad" in t for t in plain), plain
    for beam in (1, 2):  # greedy: the job is batched with constraints, not streamed without
        got = ours(server, [BIKE, DOGS], glossary=TERM, beam_size=beam)
        assert uses_term(got[0], "Vierbeiner") and uses_term(got[0], "Kerl"), got
        if beam == 1:
            assert got[1] == plain[1]  # a sentence without terms: as without a glossary
    kept = ours(server, [BIKE], glossary={"fahrrad": "Fahrrad"})[0]  # do-not-translate
    assert uses_term(kept, "Fahrrad"), kept
    assert ours(server, [DOGS], glossary=TERM) == plain[1:]  # no term found: unchanged
    # split_sentences: the glossary applies to each sentence of a text
    text = ours(server, [f"{DOGS} {BIKE}"], glossary=TERM, split_sentences=True)[0]
    assert text.startswith(plain[1]) and uses_term(text, "Vierbeiner"), text


def test_the_default_glossary_applies_and_a_request_entry_overrides_it(server: str) -> None:
    default = ours(server, [COFFEE])[0]
    assert uses_term(default, "Kerl"), default
    own = ours(server, [COFFEE], glossary={"mann": "Herrchen"})[0]  # same term, any case
    assert uses_term(own, "Herrchen") and "Kerl" not in own, own
    both = ours(server, [BIKE], glossary=TERM)[0]  # other entries of the default stay
    assert uses_term(both, "Kerl") and uses_term(both, "Vierbeiner"), both
    other = ours(server, [COFFEE], model="en-de")[0]  # ID=FILE: de-en's glossary only
    assert "Kerl" not in other, other


def test_libretranslate_takes_the_glossary_as_json_form_and_with_a_file(server: str) -> None:
    plain = libre(server, [DOGS])[0]
    got = libre(server, [f"{DOGS} {BIKE}", COFFEE], glossary=TERM)  # split into sentences
    assert got[0].startswith(plain) and uses_term(got[0], "Vierbeiner"), got
    assert uses_term(got[1], "Kerl"), got
    for multipart in (False, True):
        fields = [("q", BIKE), ("source", "de"), ("target", "en"), ("glossary", json.dumps(TERM))]
        status, answer = form(server, fields, multipart)
        assert status == 200 and uses_term(answer["translatedText"], "Vierbeiner"), answer
    fields = {"source": "de", "target": "en", "glossary": json.dumps(TERM)}
    status, answer = upload(server, "a.txt", f"{BIKE}\n".encode(), fields)
    assert status == 200, answer
    assert uses_term(download(answer)[0].decode(), "Vierbeiner")


@pytest.mark.parametrize(
    ("glossary", "status", "words"),
    [
        ({"": "Vierbeiner"}, 422, "glossary entry '': the source term is empty"),
        ({"Fahrrad": " "}, 422, "glossary entry 'Fahrrad': the target term is empty"),
        ({"Fahrrad": "Rad", "fahrrad": "Zweirad"}, 422, "'fahrrad' is already mapped to 'Rad'"),
        ({"Fahrrad": "\u200b"}, 422, "'\\u200b' has no subwords the model can write"),
        ({"Fahrrad": 3}, 400, "'glossary' must be a JSON object of strings"),
        ([["Fahrrad", "Rad"]], 400, "'glossary' must be a JSON object of strings"),
        ("Fahrrad\tRad", 400, "'glossary' must be a JSON object of strings"),
    ],
)
def test_bad_glossaries_are_4xx_json_on_both_apis(
    server: str, glossary: Any, status: int, words: str
) -> None:
    got, answer = post(server, "/translate", {"sentences": [BIKE], "glossary": glossary})
    assert (got, words in answer["error"]) == (status, True), answer
    lt = {"q": BIKE, "source": "de", "target": "en", "glossary": glossary}
    got, answer = post(server, "/translate", lt)
    assert got == 400 and answer["error"].startswith("Invalid request: "), answer
    assert words in answer["error"]
    assert ours(server, [DOGS])  # still serving


def test_glossaries_fold_case_alike_for_matching_and_lookup(server: str) -> None:
    # "İ", "ß", "ǅ": a term matched is a term found, on both APIs, request and default
    for sentence in ["Ich liebe İstanbul.", "Die STRASSE.", "ǅemal fährt Fahrrad."]:
        terms = {"Istanbul": "Istanbul", "Straße": "Vierbeiner", "ǆemal": "ǅemal"}
        got = ours(server, [sentence, BIKE], glossary=terms)
        assert len(got) == 2, got
        assert libre(server, sentence, glossary=terms)
    assert uses_term(ours(server, ["Die STRASSE."], glossary={"Straße": "Vierbeiner"})[0],
                     "Vierbeiner")  # fmt: skip


def test_a_term_over_the_output_budget_or_with_sampling_is_422(server: str) -> None:
    budget = {"max_len_a": 0, "max_len_b": 2}
    body = {"sentences": ["Das Kind fährt Fahrrad."], "glossary": TERM, **budget}
    status, answer = post(server, "/translate", body)
    assert status == 422 and "'Vierbeiner' takes" in answer["error"], answer
    assert "output budget (2)" in answer["error"] and "glossary entry 'Fahrrad'" in answer["error"]
    status, answer = post(server, "/translate", {"sentences": [COFFEE], **budget})
    error = answer["error"]  # the default's terms too, named by file and line
    assert status == 422 and "default.tsv:1: the target term 'Kerl' takes" in error, answer
    status, answer = post(server, "/translate", {"sentences": [BIKE], "sampling": True})
    assert status == 422 and "drop 'sampling'" in answer["error"], answer
    assert ours(server, [DOGS], sampling=True)  # no term in the sentence: sampling is fine


@pytest.mark.parametrize("beam", [1, 2])
def test_requests_with_other_glossaries_at_once_each_get_their_own(server: str, beam: int) -> None:
    """Each answer is the one the request gets alone: under beam search, jobs with other
    glossaries share batches; under greedy search a batch holds one of them at most."""
    glossaries = [TERM, {"Fahrrad": "Zweirad"}, None] * 3
    expected = ["Vierbeiner", "Zweirad", None] * 3
    got: list[Any] = [None] * len(glossaries)

    def send(i: int) -> None:
        body = {"sentences": [BIKE, DOGS], "glossary": glossaries[i], "beam_size": beam}
        got[i] = post(server, "/translate", body)[1]["translations"]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(glossaries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    plain = ours(server, [BIKE, DOGS], beam_size=beam)
    alone = ours(server, [BIKE, DOGS], glossary=TERM, beam_size=beam)
    for answer, term in zip(got, expected, strict=True):
        assert answer[1] == plain[1], answer
        if term is None:
            assert answer == plain
        else:
            assert uses_term(answer[0], term) and uses_term(answer[0], "Kerl"), answer
        if term == "Vierbeiner":
            assert answer == alone


@pytest.mark.parametrize(
    ("text", "flags", "words"),
    [
        ("Mann Kerl\n", [], "g.tsv:1: no tab"),
        ("Mann\tKerl\n", ["--sampling"], "--glossary constrains beam or greedy search"),
    ],
)
def test_a_bad_default_glossary_is_a_one_line_error_at_start_up(
    runs: dict[str, Path], tmp_path: Path, text: str, flags: list[str], words: str
) -> None:
    path = tmp_path / "g.tsv"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "serve.py", "-c", str(runs["de-en"]), "--glossary", str(path),
         "--port", "0", *flags],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and words in lines[0], done.stderr


# ---------------------------------------------------------------- in-process


def test_glossary_values_name_a_model_or_every_model(tmp_path: Path) -> None:
    from attnmt.server.hosting import model_glossaries

    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    a.write_text("Mann\tKerl\n", encoding="utf-8")
    b.write_text("Mann\tHerr\n", encoding="utf-8")
    found = model_glossaries([str(a), f"y={b}"], ["x", "y", "z"])
    assert {i: g.terms[0].target for i, g in found.items()} == {
        "x": "Kerl",
        "y": "Herr",
        "z": "Kerl",
    }
    assert model_glossaries([f"z={a}"], ["x", "z"]).keys() == {"z"}
    assert model_glossaries([], ["x"]) == {}
    for values, words in [
        ([f"nope={a}"], "no served model has the id 'nope' (ids: x, y)"),
        ([str(a), str(b)], "is already every model's glossary"),
        ([f"x={a}", f"x={b}"], "model 'x' already has"),
        ([str(tmp_path / "none.tsv")], "--glossary file not found"),
    ]:
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            model_glossaries(values, ["x", "y"])


def test_a_request_glossary_overrides_the_default_per_source_term() -> None:
    default = Glossary.from_mapping({"Mann": "Kerl", "Hund": "Vierbeiner"})
    merged = default.updated(Glossary.from_mapping({"mann": "Herr", "Rad": "Zweirad"}))
    assert {t.source: t.target for t in merged.terms} == {
        "Hund": "Vierbeiner", "mann": "Herr", "Rad": "Zweirad"
    }  # fmt: skip
    assert [t.target for t in merged.find("Der MANN und sein Hund")] == ["Herr", "Vierbeiner"]


class Stream:
    """A stream that answers each request in one step, uppercased."""

    def __init__(self, log: list) -> None:
        self.log, self.running, self.sentences = log, {}, 0

    def add(self, sentences: list[str]) -> int:
        self.log.append(("stream", sentences))
        self.running[len(self.log)] = sentences
        return len(self.log)

    def step(self) -> list[tuple[int, list[str]]]:
        time.sleep(0.05)  # room for the other jobs to queue behind the first
        done = [(h, [s.upper() for s in ss]) for h, ss in self.running.items()]
        self.running = {}
        return done


def test_glossary_jobs_skip_the_stream_and_share_beam_batches_not_greedy_ones() -> None:
    log: list = []

    def translate(
        cfg: Any, sentences: list[str], prefixes: list, langs: tuple, **terms: Any
    ) -> list[str]:
        log.append((cfg.beam_size, sentences, terms.get("glossaries")))
        return [s.upper() for s in sentences]

    def open_stream(cfg: SearchConfig, langs: tuple) -> Stream | None:
        return Stream(log) if cfg.beam_size == 1 else None

    one, two = Glossary.from_mapping(TERM), Glossary.from_mapping({"Fahrrad": "Zweirad"})
    for beam in (1, 2):
        log.clear()
        batcher = Batcher(translate, lambda *a: None, 8, 0.2, 10, open_stream=open_stream)
        cfg = SearchConfig(beam_size=beam)
        futures = [batcher.submit(Job(cfg, ["a"]))]
        while not log:  # the first job is running
            time.sleep(0.01)
        for job in [Job(cfg, ["b", "c"], glossary=one), Job(cfg, ["d"], glossary=two)]:
            futures.append(batcher.submit(job))
        futures.append(batcher.submit(Job(cfg, ["e"])))  # plain: joins a glossary job's batch
        batcher.close()
        assert [f.result() for f in futures] == [["A"], ["B", "C"], ["D"], ["E"]]
        if beam == 1:  # no glossary job on the stream; one per greedy batch
            assert log == [
                ("stream", ["a"]),
                (1, ["b", "c", "e"], [one, one, None]),
                (1, ["d"], [two]),
            ]
        else:  # beam search: jobs with other glossaries share a batch
            assert log == [(2, ["a"], None), (2, ["b", "c", "d", "e"], [one, one, two, None])]
