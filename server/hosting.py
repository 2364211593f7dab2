"""Hosting the served models, what `serve.py` runs: each model in a process of its own
(`server.worker`) with its batcher and model thread, routed to by its languages or its id, and
the app on uvicorn until SIGTERM or Ctrl-C. `ServeOptions` is what the command line builds
from its flags; each model's process receives `ModelProcessOptions` (pickled), never the
command line's arguments. Checkpoints, the key file, the glossaries and the port are checked
before the models load; every user mistake raises `UserError`.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.server.service import Limits

if TYPE_CHECKING:
    from attnmt.engine.runs import RuntimeOptions

# Greedy requests arriving one by one wait up to this many steps to be encoded together
# (`GreedyStream`'s `gather`): 1.05x the sentences/s at 32 clients, 2 and 3 alike
# (docs/benchmarks.md, "The server's steps").
STREAM_GATHER = 2
KEEP_ALIVE_S = 5  # an idle connection is closed this long after its last answer (uvicorn's)


@dataclass(frozen=True)
class ModelProcessOptions:
    """What each model's process is told (pickled into it): how to run the model
    (`engine.runs.RuntimeOptions`' fields) and how to batch its requests."""

    device: str = "auto"
    precision: str = "fp32"
    quantize: str = "none"
    given: frozenset[str] = frozenset()  # the search fields and "precision" typed
    max_beam: int = 16  # a run decoding with a larger beam is refused
    max_queue: int = 256
    batch_wait_ms: float = 5.0
    no_batching: bool = False
    prog: str = "serve.py"
    pack: str = "auto"

    def runtime(self) -> RuntimeOptions:
        from attnmt.engine.runs import RuntimeOptions

        return RuntimeOptions(
            self.device, self.precision, self.quantize, self.given, self.prog, self.pack
        )


@dataclass(frozen=True)
class ServeOptions:
    """What `serve` serves, and how (serve.py's flags of the same names)."""

    checkpoints: tuple[str, ...]  # each -c: [ID=]CHECKPOINT
    search: SearchConfig  # the default options (the search flags)
    model: ModelProcessOptions
    limits: Limits
    host: str = "127.0.0.1"
    port: int = 8000
    glossaries: tuple[str, ...] = ()  # each --glossary: [ID=]FILE
    api_keys: str | None = None
    key_rate: float | None = None
    shutdown_timeout: float = 120.0


def serve(options: ServeOptions) -> None:
    """Load the model once, then serve until SIGTERM or Ctrl-C (both exit 0 once the
    requests already received are answered)."""
    defaults, model_options, prog = options.search, options.model, options.model.prog
    specs = model_specs(list(options.checkpoints))
    glossaries = model_glossaries(list(options.glossaries), [model_id for model_id, _ in specs])
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]

    import uvicorn

    from attnmt.server.app import create_app
    from attnmt.server.connections import timed_protocol
    from attnmt.server.keys import KeyRing
    from attnmt.server.service import ServedModel, Service

    rate = 60.0 if options.key_rate is None else options.key_rate
    keys = KeyRing.from_file(options.api_keys, rate) if options.api_keys else None
    served: list[ServedModel] = []
    metrics_of: dict[str, Any] = {}  # model id -> the app's Metrics, once it exists
    # every model's process starts before the first is waited for: they load at once
    starting = [
        (model_id, serve_model(model_options, model_id, path, defaults, metrics_of))
        for model_id, path in specs
    ]
    for model_id, loaded in starting:
        model = loaded()
        model.glossary = glossaries.get(model_id)
        served.append(model)
    limits = options.limits
    service = Service(served, served[0].defaults or defaults, limits, keys)  # the default model's
    mode = (
        "batching off"
        if model_options.no_batching
        else f"batches up to {defaults.batch_size} sentences"
    )
    if keys is not None:
        mode += f"; {len(keys)} API keys"

    def ready() -> None:
        names = ", ".join(
            f"{m.id}={m.info['checkpoint']}" if len(served) > 1 else m.info["checkpoint"]
            for m in served
        )
        print(
            f"{prog}: serving {names} on http://{host}:{port} ({mode}); SIGTERM or Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )

    app = create_app(service, on_startup=ready)
    for model in served:
        metrics_of[model.id] = service.metrics
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=options.shutdown_timeout,
        lifespan="on",
        http=timed_protocol(limits.client_timeout),  # a late request head closes its connection
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down, with the handler
    # that was installed before it started: this one, so that a graceful stop exits 0. (A
    # signal before uvicorn installs its own handlers makes it stop as soon as it starts.)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: setattr(server, "should_exit", True))
    server.run(sockets=[sock])
    if not server.started:
        raise UserError("the server did not start (see the messages above)")
    left = (
        f" ({service.gone} dropped: their clients closed the connection first)"
        if service.gone
        else ""
    )
    if service.cancelled:
        print(
            f"{prog}: stopped; {service.cancelled} request(s) still unanswered after "
            f"--shutdown-timeout {options.shutdown_timeout:g} s were dropped{left}",
            file=sys.stderr,
        )
    else:
        print(
            f"{prog}: stopped after answering every request it had received{left}", file=sys.stderr
        )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so that a busy port fails fast."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: {e.strerror}; pass an address such as 127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port} ({e.strerror}); pass another --port"
        ) from None
    sock.listen(2048)
    return sock


def model_specs(values: list[str]) -> list[tuple[str, str]]:
    """(id, checkpoint path) of each `-c`: `ID=PATH`, or PATH with the run dir's name as id
    (a .pt file's run dir when it sits in `checkpoints/`, else its stem); repeated ids get
    `-2`, `-3`, ..."""
    specs: list[tuple[str, str]] = []
    for value in values:
        name, sep, rest = value.partition("=")
        if sep and name and "/" not in name and not Path(value).exists():
            model_id, path = name, rest
            if any(model_id == known for known, _ in specs):
                raise UserError(f"-c {value}: the id {model_id!r} is taken; give another ID=")
        else:
            path = value
            file = Path(value)
            if file.is_dir():
                base = file.resolve().name
            elif file.parent.name == "checkpoints":
                base = file.resolve().parent.parent.name
            else:
                base = file.stem
            model_id, n = base or "model", 1
            while any(model_id == known for known, _ in specs):
                n += 1
                model_id = f"{base}-{n}"
        specs.append((model_id, path))
    return specs


def model_glossaries(values: list[str], ids: list[str]) -> dict[str, Any]:
    """Model id -> its default `Glossary`, from the `--glossary` values: `ID=FILE` for the
    model of that id, FILE for every model without an `ID=` of its own; at most one each.

    Raises:
        UserError: an unknown id, two glossaries for one model, or a file that cannot be read
            or holds a bad line (`GlossaryError`: the file and line).
    """
    from attnmt.decoding.glossary import Glossary

    every: str | None = None
    own: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if sep and name and "/" not in name and not Path(value).exists():
            if name not in ids:
                raise UserError(
                    f"--glossary {value}: no served model has the id {name!r} (ids: "
                    f"{', '.join(ids)}); name one, or give the glossary's path alone"
                )
            if name in own:
                raise UserError(f"--glossary {value}: model {name!r} already has {own[name]}")
            own[name] = rest
        elif every is not None:
            raise UserError(
                f"--glossary {value}: {every} is already every model's glossary; give one "
                "FILE, and ID=FILE for the models that need another"
            )
        else:
            every = value
    paths = {i: own.get(i, every) for i in ids if own.get(i, every) is not None}
    loaded = {path: Glossary.from_file(path) for path in dict.fromkeys(paths.values())}
    return {i: loaded[path] for i, path in paths.items()}


def model_info(path: str) -> dict[str, Any]:
    """What `GET /info` reports: languages, sizes, vocabulary, step, and the run's BLEU from
    its results.json when there is one; `languages` holds (sources, targets) for routing and
    `tokenizer` the stored tokenizer (both for the caller to pop)."""
    from attnmt.checkpoint import load_checkpoint, resolve_checkpoint, stored_tokenizer
    from attnmt.data.languages import model_languages

    file = resolve_checkpoint(path)
    ckpt = load_checkpoint(file)  # read again by load_engine: once, at startup
    sources, targets = model_languages(ckpt)
    model_cfg = ckpt["model_config"]
    info: dict[str, Any] = {
        "checkpoint": str(file),
        "step": (ckpt.get("train_state") or {}).get("step"),
        "source_language": sources[0] if len(sources) == 1 else None,
        "target_language": targets[0] if len(targets) == 1 else None,
        "languages": (sources, targets),
        "tokenizer": stored_tokenizer(ckpt, file),
        "model": model_cfg,
    }
    run_dir = Path(path) if Path(path).is_dir() else file.parent.parent
    results = run_dir / "results.json"
    if file.parent.name == "checkpoints" and results.is_file():
        try:
            scores = json.loads(results.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            scores = {}
        info["valid_bleu"] = (scores.get("valid") or {}).get("bleu")
        tests = scores.get("test") or {}
        info["test_bleu"] = {name: split.get("bleu") for name, split in tests.items()}
    return info


def serve_model(
    options: ModelProcessOptions,
    model_id: str,
    path: str,
    defaults: SearchConfig,
    metrics_of: dict[str, Any],
) -> Callable[[], Any]:
    """One model: its process started (`server.worker.ModelProcess`: the model loaded there,
    its batcher and model thread), and `loaded()`, which waits for the model and returns it
    served: with, here in the HTTP process, its tokenizer, for counting a request's tokens and
    checking its terms before the request is sent."""
    from functools import partial

    from attnmt.data.languages import is_multilingual
    from attnmt.decoding.translator import Translator
    from attnmt.server.service import ServedModel
    from attnmt.server.worker import ModelProcess, StartError

    info = model_info(path)
    sources, targets = info.pop("languages")
    tokenizer = info.pop("tokenizer")
    record = partial(record_batch, metrics_of, model_id)
    multilingual = is_multilingual(sources, targets)
    started = (options, path, defaults, multilingual)
    name = f"model-{model_id}"
    batcher = ModelProcess(load_batcher, started, options.max_queue, record, name=name, wait=False)
    tokenizer_for = pair_tokenizers(tokenizer, multilingual)

    def token_counts(sentences: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer.encode_src([s.strip() for s in sentences])]

    def count_tokens(sentences: list[str]) -> int:
        return max(token_counts(sentences))

    def check_terms(
        cfg: Any, sentences: list[str], prefixes: Any, glossary: Any, langs: tuple
    ) -> None:
        translator = Translator(None, tokenizer_for(langs), cfg, "cpu")  # tokenizing only
        translator.check_terms(sentences, glossary, prefixes)

    def loaded() -> Any:
        try:
            facts = dict(batcher.wait())
        except StartError as e:
            if e.user_error:
                raise UserError(str(e)) from None
            raise
        model_defaults, precision, device = (facts.pop(k) for k in ("defaults", "precision", "device"))  # fmt: skip
        info.update(facts, device=device, precision=precision, quantize=options.quantize)
        served = ServedModel(model_id, sources, targets, batcher, count_tokens, info, model_defaults)  # fmt: skip
        served.check_terms = check_terms  # on a worker thread: tokenizing only, no model call
        served.token_counts = token_counts
        return served

    return loaded


def pair_tokenizers(tokenizer: Any, multilingual: bool) -> Any:
    """tokenizer_for(langs): a multilingual model's tokenizer of the requested pair (made
    once per pair), or the model's own for any other."""
    bound: dict[tuple, Any] = {}

    def tokenizer_for(langs: tuple[str | None, str | None]) -> Any:
        if not multilingual:
            return tokenizer
        if langs not in bound:
            bound[langs] = tokenizer.for_languages(*langs)
        return bound[langs]

    return tokenizer_for


def load_batcher(
    record: Any,
    options: ModelProcessOptions,
    path: str,
    defaults: SearchConfig,
    multilingual: bool,
) -> tuple[Any, dict[str, Any]]:
    """In the model process: the model loaded, with its batcher (model thread); the pair a
    request names reaches the translator in `translate`/`attention` below, and only for a
    multilingual model. `record(sentences, source tokens, target tokens, seconds)` takes
    each batch's metrics. Also returns what the parent reports: the decoding, the device,
    the parameters and vocabulary."""
    import time
    from functools import partial

    import torch

    from attnmt.common import runtime
    from attnmt.decoding.translator import Translator
    from attnmt.engine.requests import RequestStream
    from attnmt.engine.runs import load_model
    from attnmt.server.batcher import Batcher

    model, tokenizer, device = load_model(options.runtime(), [path])
    defaults, precision = model_decoding(options, defaults, path, device)
    tokenizer_for = pair_tokenizers(tokenizer, multilingual)

    def translate(
        cfg: Any,
        sentences: list[str],
        prefixes: list[str],
        langs: tuple,
        glossaries: Any = None,
        stop: Any = None,
    ) -> list[list[tuple[str, float]]]:
        began = time.perf_counter()
        paired = tokenizer_for(langs)
        translator = Translator(model, paired, cfg, device, stop=stop)
        with runtime.autocast(device, precision):  # thread-local: entered on this thread
            nbest = translator.translate_nbest(sentences, prefixes=prefixes, glossary=glossaries)
        src_tokens = sum(len(ids) for ids in paired.encode_src(sentences))  # no EOS
        tgt_tokens = sum(len(hyps[0].tokens) for hyps in nbest if hyps)
        record(len(sentences), src_tokens, tgt_tokens, time.perf_counter() - began)
        return [[(h.text, h.score) for h in hyps] for hyps in nbest]

    def attention(cfg: Any, sentence: str, langs: tuple) -> dict[str, Any]:
        translator = Translator(model, tokenizer_for(langs), cfg, device)
        with torch.no_grad(), runtime.autocast(device, precision):
            found = translator.attention_for(sentence)
            text = translator.translate([sentence])[0]
        weights = found.cross_attn  # (L, H, T, S)
        return {
            "translation": text,
            "src_pieces": found.src_pieces,
            "tgt_pieces": found.tgt_pieces,
            "layers": weights.size(0),
            "heads": weights.size(1),
            "attention": weights.double().round(decimals=4).tolist(),  # 4 digits: JSON size
        }

    def open_stream(cfg: Any, langs: tuple) -> Any:
        """Greedy or beam requests joining one continuous batch between its steps, or None."""
        context = partial(runtime.autocast, device, precision)  # entered on the model thread
        return RequestStream.open(
            model, tokenizer_for(langs), cfg, STREAM_GATHER, context=context, record=record
        )

    batcher = Batcher(
        translate,
        attention,
        max_sentences=defaults.batch_size,
        wait=options.batch_wait_ms / 1000,
        max_queue=options.max_queue,
        one_request=options.no_batching,
        open_stream=open_stream,
    )
    facts = {"defaults": defaults, "precision": precision, "device": device}
    return batcher, {**facts, **loaded_facts(model, tokenizer)}


def model_decoding(
    options: ModelProcessOptions, defaults: SearchConfig, path: str, device: str
) -> tuple[SearchConfig, str]:
    """(the options, the precision) a request to the model at `path` starts from: what
    translate.py -c PATH decodes with, the run's recorded decoding (results.json's) with the
    search flags and --precision applied."""
    from attnmt.engine.runs import run_decoding

    defaults, precision, _ = run_decoding(options.runtime(), defaults, path, device)
    if defaults.beam_size > options.max_beam:
        raise UserError(
            f"-c {path} decodes with beam {defaults.beam_size}, above --max-beam "
            f"{options.max_beam}; raise --max-beam or pass --beam"
        )
    return defaults, precision


def loaded_facts(model: Any, tokenizer: Any) -> dict[str, Any]:
    """What `GET /info` reports of a loaded model: its parameters and vocabulary sizes."""
    vocab = {"source": tokenizer.src_vocab_size, "target": tokenizer.tgt_vocab_size}
    return {
        "parameters": sum(p.numel() for p in model.parameters()),  # tied weights once
        "vocab": {**vocab, "joint": tokenizer.joint},
    }


def record_batch(metrics_of: dict[str, Any], model_id: str, *figures: Any) -> None:
    """`Metrics.batch(model_id, sentences, source tokens, target tokens, seconds)`, once the
    app has made its metrics."""
    metrics = metrics_of.get(model_id)
    if metrics is not None:
        metrics.batch(model_id, *figures)
