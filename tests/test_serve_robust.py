"""No request takes the server down: each request's work is bounded before it starts (one
work limit), a request's input is parsed on a worker thread after its size is checked, a file
upload is bounded before it is parsed, and a started stream stops between its steps once its
clients have gone. In process: the app is called as ASGI, over a batcher whose model
upper-cases (no torch model)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import threading
import zipfile
from typing import Any

import pytest
from starlette.formparsers import MultiPartParser

from attnmt.decoding.config import MAX_LENGTH_PENALTY, SearchConfig
from attnmt.server.app import create_app
from attnmt.server.batcher import Batcher, Gone, Job
from attnmt.server.documents import MAX_UPLOADS, FileError, parse_file, safe_name
from attnmt.server.handling import MAX_TERM_CHARS, MAX_TERMS
from attnmt.server.service import Limits, ServedModel, Service

LIMITS = Limits(64, 1000, 16, 1024, max_work=32768)


class Model:
    """The batcher's callables: upper-cases; records the threads that tokenized."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.token_threads: set[int] = set()

    def translate(self, cfg: SearchConfig, sentences: list[str], *args: Any, **kw: Any) -> list:
        self.calls.append(sentences)
        return [[(s.upper(), -1.0)] * cfg.nbest for s in sentences]

    def attention(self, cfg: SearchConfig, sentence: str, langs: tuple) -> dict:
        return {"translation": sentence.upper()}

    def count(self, sentences: list[str]) -> list[int]:
        self.token_threads.add(threading.get_ident())
        return [len(s.split()) + 1 for s in sentences]


def make_service(limits: Limits = LIMITS) -> tuple[Service, Model]:
    model = Model()
    batcher = Batcher(model.translate, model.attention, 64, 0.0, 16)
    served = ServedModel(
        "m", ["en"], ["de"], batcher, lambda s: max(model.count(s)),
        info={"model": {"n_decoder_layers": 6, "n_heads": 8}},
    )  # fmt: skip
    served.token_counts = model.count
    return Service([served], SearchConfig(beam_size=1), limits), model


def call(
    service: Service, method: str, path: str, body: bytes = b"", kind: str = "application/json"
) -> tuple[int, Any]:
    """(status, JSON answer) of one request to a fresh app; the client stays connected."""
    app = create_app(service)
    sent: list[dict] = []

    async def run() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # connected until the answer is sent
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "method": method, "path": path, "headers": headers,
                 "query_string": b"", "root_path": "", "scheme": "http",
                 "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
        await app(scope, receive, send)

    asyncio.run(run())
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(data)


def post(service: Service, path: str, body: Any) -> tuple[int, Any]:
    return call(service, "POST", path, json.dumps(body).encode())


def test_n_best_samples_beams_and_budgets_are_bounded_by_one_work_limit() -> None:
    """sentences x candidates x output budget over --max-work: 422 naming the field, before
    the model is called; 2^62 samples too (was 15 GB, or a 500)."""
    service, model = make_service()
    one = ["A man rides a bike."]
    for nbest in (100_000, 2**62):
        status, answer = post(service, "/translate", {"sentences": one, "sampling": True, "nbest": nbest})  # fmt: skip
        assert status == 422 and "'nbest'" in answer["error"] and "--max-work" in answer["error"]
    long = {"sentences": one * 16, "beam_size": 5, "max_len_a": 0, "max_len_b": 1000}
    status, answer = post(service, "/translate", long)
    assert status == 422 and "'beam_size' 5" in answer["error"]
    status, answer = post(service, "/translate", {"sentences": one, "sampling": True, "nbest": 4})
    assert status == 200 and len(answer["nbest"][0]) == 4
    assert model.calls == [one]
    status, answer = call(service, "GET", "/frontend/settings")
    assert answer["limits"]["max_work"] == 32768


def test_request_preparation_runs_off_the_event_loop() -> None:
    """Tokenizing for the limits (and so splitting, parsing and glossary checks) happens on
    a worker thread, not on the thread that serves every connection."""
    service, model = make_service()
    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    assert post(service, "/translate", {"sentences": ["a b"]})[0] == 200
    form = b"q=a+b&source=en&target=de"
    assert call(service, "POST", "/translate", form, "application/x-www-form-urlencoded")[0] == 200
    assert model.token_threads and loop_thread not in model.token_threads


def test_a_form_with_a_hundred_thousand_fields_is_refused_unparsed() -> None:
    service, model = make_service()
    form = b"&".join([b"q=x"] * 100_000) + b"&source=en&target=de"
    status, answer = call(service, "POST", "/translate", form, "application/x-www-form-urlencoded")
    assert status == 400 and "fields" in answer["error"]
    assert model.calls == []


def test_a_glossary_term_is_bounded_before_its_spellings_are_searched() -> None:
    service, model = make_service()
    terms = {f"bike{i}": "Fahrrad" * 300 for i in range(3)}  # 2,100 characters each
    body = {"sentences": ["A man rides a bike0."], "glossary": terms}
    status, answer = post(service, "/translate", body)
    assert status == 422 and "characters, the limit is 128" in answer["error"]


def test_attention_answers_are_bounded() -> None:
    service, _ = make_service()
    status, answer = post(service, "/attention", {"sentence": "a " * 200, "max_len_b": 600})
    assert status == 413 and "weights" in answer["error"]
    assert post(service, "/attention", {"sentence": "a b"})[0] == 200


def docx_with_document_xml(size: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", b"<w:document>" + b" " * size + b"</w:document>")
    return out.getvalue()


def test_a_docx_memory_bomb_is_refused_from_its_zip_directory() -> None:
    """A document.xml that unpacks to 20 MiB (under the 128 MiB unzip cap) is refused by its
    declared size, before python-docx parses it."""
    with pytest.raises(FileError, match="holds XML of"):
        parse_file("bomb.docx", docx_with_document_xml(20 * 2**20))


def test_a_txt_file_of_blank_lines_is_refused_before_it_is_split() -> None:
    with pytest.raises(FileError, match="lines, the limit is 64000"):
        parse_file("blank.txt", b"\n" * 1_000_000, 64_000)
    assert parse_file("ok.txt", b"a\n\nb\n", 64_000).texts == ["a", "", "b"]


def multipart(filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "XyZ"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in (("source", "en"), ("target", "de"))
    ]
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n\r\n'  # noqa: E501
    body = "".join(parts).encode() + head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_a_file_named_dot_txt_is_translated_and_uploads_at_once_are_limited() -> None:
    """A file named ".txt" is kept as "file.txt" (was a 500 after it was counted); beyond
    `MAX_UPLOADS` files at once, 429."""
    assert safe_name(".txt") == "file.txt" and safe_name("a b.html") == "a_b.html"
    service, model = make_service()
    body, kind = multipart(".txt", b"hello\n")
    status, answer = call(service, "POST", "/translate_file", body, kind)
    assert status == 200 and answer["translatedFileUrl"].endswith(".file.txt")
    assert model.calls == [["hello"]]
    service.uploads = MAX_UPLOADS  # that many files being read or translated
    status, answer = call(service, "POST", "/translate_file", body, kind)
    assert status == 429 and model.calls == [["hello"]]


def test_multipart_forms_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """/translate's and /translate_file's multipart forms are parsed on a worker thread, with
    their bounds: over --max-sentences + 16 fields is one 400 line."""
    service, model = make_service()
    loop_thread, parse_threads = threading.get_ident(), []
    parse = MultiPartParser.parse

    async def recording_parse(self: MultiPartParser) -> Any:
        parse_threads.append(threading.get_ident())
        return await parse(self)

    monkeypatch.setattr(MultiPartParser, "parse", recording_parse)
    fields = [("q", "a b"), ("q", "c"), ("source", "en"), ("target", "de")]
    body = "".join(
        f'--XyZ\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields
    )
    kind = "multipart/form-data; boundary=XyZ"
    status, answer = call(service, "POST", "/translate", f"{body}--XyZ--\r\n".encode(), kind)
    assert status == 200 and len(answer["translatedText"]) == 2
    assert call(service, "POST", "/translate_file", *multipart("a.txt", b"hello\n"))[0] == 200
    assert len(parse_threads) == 2 and loop_thread not in parse_threads
    many = body * (service.limits.max_sentences + 16)
    status, answer = call(service, "POST", "/translate", f"{many}--XyZ--\r\n".encode(), kind)
    assert status == 400 and answer["error"].startswith("Invalid request: the form cannot be read")
    assert "\n" not in answer["error"] and "fields" in answer["error"]


class EndlessStream:
    """A stream that never finishes its requests (a decode up to a huge budget)."""

    def __init__(self, steps: list[int]) -> None:
        self.steps, self.sentences = steps, 0

    def add(self, sentences: list[str]) -> int:
        self.sentences += len(sentences)
        return len(self.steps)

    def step(self) -> list:
        self.steps.append(1)
        return []

    def cancel(self, handles: list[int]) -> None:
        self.sentences = 0


def test_a_stream_whose_clients_have_gone_stops_between_steps() -> None:
    """A started job whose client has gone (`Job.gone`) stops its stream at the next step,
    so the next request is served (was: the stream ran to its budget)."""
    steps: list[int] = []
    model = Model()

    def open_stream(cfg: SearchConfig, langs: tuple) -> EndlessStream | None:
        return EndlessStream(steps) if cfg.beam_size == 1 else None

    batcher = Batcher(model.translate, model.attention, 8, 0.0, 8, open_stream=open_stream)
    endless = Job(SearchConfig(beam_size=1), ["a"])
    batcher.submit(endless)
    while len(steps) < 3:  # started, and stepping
        threading.Event().wait(0.01)
    endless.gone.set()
    with pytest.raises(Gone):
        endless.future.result(timeout=30)
    after = batcher.submit(Job(SearchConfig(beam_size=2), ["b"]))
    assert after.result(timeout=30) == [[("B", -1.0)]]
    batcher.close()


class CountedStream:
    """A stream whose request of n sentences takes 4 * n steps, answered upper-cased; it
    logs each step's live handles and each cancel; step t waits for `hold[t]`, if any."""

    def __init__(self, log: list, hold: dict[int, threading.Event]) -> None:
        self.log, self.hold, self.running, self.sentences = log, hold, {}, 0
        self.handles = 0

    def add(self, sentences: list[str]) -> int:
        handle, self.handles = self.handles, self.handles + 1
        self.running[handle] = [sentences, 4 * len(sentences)]
        self.sentences += len(sentences)
        return handle

    def step(self) -> list:
        self.log.append(sorted(self.running))
        if len(self.log) in self.hold:
            assert self.hold[len(self.log)].wait(30)
        done = []
        for handle, request in list(self.running.items()):
            request[1] -= 1
            if request[1] == 0:
                done.append((handle, [s.upper() for s in request[0]]))
                self.sentences -= len(request[0])
                del self.running[handle]
        return done

    def cancel(self, handles: list[int]) -> None:
        self.log.append(("cancel", handles))
        for handle in handles:
            self.sentences -= len(self.running.pop(handle)[0])


def test_a_gone_job_leaves_its_stream_between_steps_while_the_others_go_on() -> None:
    """A job whose client has gone leaves the stream it shares at the next step (its
    sentences cancelled, answered `Gone`) while the other job steps on to its own answer
    (was: the stream decoded it for as long as any job in it had a client)."""
    log: list = []
    hold = {1: threading.Event(), 3: threading.Event()}
    model = Model()

    def open_stream(cfg: SearchConfig, langs: tuple) -> CountedStream | None:
        return CountedStream(log, hold)

    batcher = Batcher(model.translate, model.attention, 64, 0.0, 8, open_stream=open_stream)
    left = Job(SearchConfig(beam_size=1), ["x"] * 10)  # 40 steps
    stays = Job(SearchConfig(beam_size=1), ["a", "b"])  # 8 steps
    batcher.submit(left)
    batcher.submit(stays)  # it joins after the first step
    hold[1].set()
    while len(log) < 3:  # both in the stream, the third step waiting
        threading.Event().wait(0.01)
    left.gone.set()
    hold[3].set()
    with pytest.raises(Gone):
        left.future.result(timeout=30)
    assert stays.future.result(timeout=30) == ["A", "B"]
    batcher.close()
    cancels = [entry for entry in log if entry[0] == "cancel"]
    assert cancels == [("cancel", [0])]
    after = log[log.index(cancels[0]) + 1 :]
    # the staying job (joined after the first step) alone for the rest of its 8 steps
    assert log[:3] == [[0], [0, 1], [0, 1]] and after == [[1]] * 6


def test_a_batch_call_whose_clients_have_gone_stops_between_steps() -> None:
    """A batch call (here a sampling job, which never streams) gets `stop`, checked between
    its steps: once its client has gone the search stops there, the job answered `Gone`, and
    the next job is served (was: the call decoded to its budget)."""
    steps: list[int] = []
    hold = threading.Event()

    def translate(
        cfg: SearchConfig, sentences: list[str], prefixes: list, langs: tuple, stop: Any = None
    ) -> list:
        for step in range(1000):  # a search to a budget of 1000 steps
            if stop is not None and stop():
                raise RuntimeError("cancelled")  # as `search.Cancelled`
            steps.append(step)
            if step == 2:
                assert hold.wait(30)
        return [[(s.upper(), -1.0)] for s in sentences]

    batcher = Batcher(translate, Model().attention, 8, 0.0, 8)
    sampled = Job(SearchConfig(sampling=True), ["a"])
    batcher.submit(sampled)
    while len(steps) < 3:  # decoding, its third step waiting
        threading.Event().wait(0.01)
    sampled.gone.set()
    hold.set()
    with pytest.raises(Gone):
        sampled.future.result(timeout=30)
    assert steps == [0, 1, 2]  # stopped before its fourth step
    after = batcher.submit(Job(SearchConfig(beam_size=2), ["b"]))
    assert after.result(timeout=30) == [[("B", -1.0)]]
    batcher.close()


def test_each_option_bound_is_stated_once_in_decoding_and_both_checked_and_documented() -> None:
    """The schema's bounds of each option are its `SearchConfig` field's (decoding's one
    statement), the deployment's caps added; a value past one is a 422 naming the field,
    whatever bound it breaks (the length penalty's maximum was checked but not documented)."""
    service, model = make_service()
    doc = call(service, "GET", "/openapi.json")[1]
    content = doc["paths"]["/translate"]["post"]["requestBody"]["content"]
    ours = content["application/json"]["schema"]["oneOf"][0]["properties"]
    keys = {"min": "minimum", "above": "exclusiveMinimum", "max": "maximum"}
    for f in dataclasses.fields(SearchConfig):
        if f.name == "batch_size":
            continue
        stated = {keys[k]: v for k, v in f.metadata.items() if k in keys and v is not None}
        schema = ours[f.name].get("anyOf", [ours[f.name]])[0]
        caps = {"beam_size": LIMITS.max_beam, "nbest": LIMITS.max_work}
        if f.name in caps:
            stated["maximum"] = caps[f.name]
        assert {k: schema[k] for k in stated if k in schema} == stated, f.name
    assert ours["length_penalty"]["maximum"] == MAX_LENGTH_PENALTY
    assert ours["topp"]["exclusiveMinimum"] == 0 and ours["topp"]["maximum"] == 1
    for option, value in [("length_penalty", 21), ("topp", 0), ("temperature", 0), ("topp", 2)]:
        body = json.dumps({"sentences": ["a"], option: value}).encode()
        status, answer = call(service, "POST", "/translate", body)
        assert status == 422 and set(answer) == {"error"} and option in answer["error"], answer
    lt = json.dumps({"q": "a", "source": "en", "target": "de", "alternatives": 16}).encode()
    status, answer = call(service, "POST", "/translate", lt)
    assert status == 400 and "alternatives" in answer["error"]
    lt_schema = content["application/json"]["schema"]["oneOf"][1]["properties"]
    assert lt_schema["alternatives"]["anyOf"][0]["maximum"] == LIMITS.max_beam - 1
    terms = ours["glossary"]["anyOf"][0]  # both terms bounded, as the check bounds them
    assert terms["maxProperties"] == MAX_TERMS
    assert terms["propertyNames"]["maxLength"] == MAX_TERM_CHARS
    assert terms["additionalProperties"]["maxLength"] == MAX_TERM_CHARS
    long_source = {"sentences": ["a"], "glossary": {"a" * (MAX_TERM_CHARS + 1): "b"}}
    status, answer = call(service, "POST", "/translate", json.dumps(long_source).encode())
    assert status == 422 and "limit is 128" in answer["error"], answer
    assert model.calls == []
