"""The `serve.py` command line: its flags, loading the model once, and running the server.

`-c` may be given several times (`-c RUN_A -c ID=RUN_B`): each model gets its own process
(`server.worker`), batching queue and model thread, and is routed to by its languages
(`data.languages`) or its id (the run dir's name unless `ID=` names it); the first is the
default model. The search flags (`--beam`, `--length-penalty`, ...) come from `SearchConfig`,
as in translate.py, and set the server's default options, which each request may override
(`server.options`); `--batch-size` bounds the sentences of one dynamic batch. `--glossary
[ID=]FILE` gives a model a default glossary (`decoding.glossary`): FILE alone applies to every
model without one of its own, ID= to the model of that id; a request's `glossary` entries
override it per source term. Flags, the checkpoints, the key file, the glossaries and the port
are checked before the models load; every user mistake raises `UserError` (one line, exit 1)
or exits 2 for a bad flag.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnmt.cli.args import Parser, number, program_name
from attnmt.cli.translate import (
    add_runtime_flags,
    add_search_flags,
    load_model,
    run_decoding,
    search_config,
)
from attnmt.common.errors import UserError

PROG = program_name("serve.py")
# Greedy requests arriving one by one wait up to this many steps to be encoded together
# (`GreedyStream`'s `gather`): 1.05x the sentences/s at 32 clients, 2 and 3 alike
# (docs/benchmarks.md, "The server's steps").
STREAM_GATHER = 2
KEEP_ALIVE_S = 5  # an idle connection is closed this long after its last answer (uvicorn's)


# What --nbest does here (translate.py prints the hypotheses; the API returns them).
_NBEST_HELP = (
    "; above 1, a /translate answer adds 'nbest': each sentence's hypotheses with their scores "
    "(LibreTranslate's route returns alternatives only when a request asks for them)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Serve translations over HTTP (JSON API) with a page that shows the "
        "cross-attention; see docs/serving.md.",
        epilog="The search flags set the default options; a request may override each of "
        "them except --batch-size, which bounds the sentences of one dynamic batch. SIGTERM "
        "or Ctrl-C: the requests already received are answered, then the server exits 0.",
    )
    add = parser.add_argument
    add(
        "-c",
        "--checkpoint",
        required=True,
        action="append",
        metavar="[ID=]CHECKPOINT",
        help="run dir (checkpoints/best.pt, else last.pt) or .pt file; repeat it to serve "
        "several models, routed by language pair or by ID (default: the run dir's name)",
    )
    add("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    add("--port", type=number(int, 0), default=8000, help="port; 0 = any free one (default: 8000)")
    add_search_flags(parser, _NBEST_HELP)
    add(
        "--glossary",
        action="append",
        metavar="[ID=]FILE",
        help="a default glossary: a TSV of 'source term<TAB>target term' lines (as translate.py "
        "--glossary); FILE alone: for every model, ID=FILE: for the model of that id; a "
        "request's glossary entries override it per source term",
    )
    add_runtime_flags(parser)
    add(
        "--batch-wait-ms",
        type=number(float, 0),
        default=5.0,
        metavar="MS",
        help="how long the oldest request waits for others to join its batch (default: 5)",
    )
    add(
        "--no-batching",
        action="store_true",
        help="one request per model call, no waiting (for comparison)",
    )
    add_limit_flags(parser)
    add(
        "--api-keys",
        metavar="FILE",
        help="require an API key: FILE has one key per line, optionally followed by its cap "
        "in requests per minute (default: none needed)",
    )
    add(
        "--key-rate",
        type=number(float, 0.001),
        metavar="N",
        help="requests per minute of a key whose line names no cap (default: 60)",
    )
    add(
        "--shutdown-timeout",
        type=number(float, 1),
        default=120.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long to wait for the requests already received "
        "(a client that never finishes sending cannot hold the server up longer) "
        "(default: 120)",
    )
    return parser


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """What one request may ask for (`server.service.Limits`) and the queue's length."""
    add = parser.add_argument
    add(
        "--max-sentences",
        type=number(int, 1),
        default=64,
        metavar="N",
        help="sentences per /translate request (default: 64)",
    )
    add(
        "--max-chars",
        type=number(int, 1),
        default=1000,
        metavar="N",
        help="characters per sentence (default: 1000)",
    )
    add(
        "--max-queue",
        type=number(int, 1),
        default=256,
        metavar="N",
        help="requests waiting for the model; beyond, 429 (default: 256)",
    )
    add(
        "--max-beam",
        type=number(int, 1),
        default=16,
        metavar="N",
        help="largest beam_size a request may ask for (default: 16)",
    )
    add(
        "--max-output-tokens",
        type=number(int, 1),
        default=1024,
        metavar="N",
        help="largest output length budget, int(max_len_a * source tokens + max_len_b), a "
        "request may ask for (default: 1024)",
    )
    add(
        "--max-work",
        type=number(int, 1),
        default=32768,
        metavar="N",
        help="most output tokens one request's search may compute: its candidates per "
        "sentence (beam_size, or nbest samples) times its sentences' output budgets, summed; "
        "beyond, 422 (default: 32768)",
    )
    add(
        "--client-timeout",
        type=number(float, 0.001),
        default=30.0,
        metavar="SECONDS",
        help="how long a client may take to send a request's headers, and then its body; "
        "beyond, the connection is closed (headers) or answered 408 (body) (default: 30)",
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


def run(args: argparse.Namespace) -> None:
    """Load the model once, then serve until SIGTERM or Ctrl-C (both exit 0 once the
    requests already received are answered)."""
    defaults = search_config(args)
    if defaults.beam_size > args.max_beam:
        raise UserError(
            f"--beam {defaults.beam_size} is above --max-beam {args.max_beam}; lower --beam "
            "or raise --max-beam"
        )
    if args.key_rate is not None and not args.api_keys:
        raise UserError("--key-rate caps the keys of --api-keys FILE: add --api-keys or drop it")
    if args.glossary and args.sampling:
        raise UserError(
            "--glossary constrains beam or greedy search: drop --sampling or --glossary"
        )
    specs = model_specs(args.checkpoint)
    glossaries = model_glossaries(args.glossary or [], [model_id for model_id, _ in specs])
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]

    import uvicorn

    from attnmt.server.app import create_app
    from attnmt.server.connections import timed_protocol
    from attnmt.server.keys import KeyRing
    from attnmt.server.service import Limits, ServedModel, Service

    rate = 60.0 if args.key_rate is None else args.key_rate
    keys = KeyRing.from_file(args.api_keys, rate) if args.api_keys else None
    served: list[ServedModel] = []
    metrics_of: dict[str, Any] = {}  # model id -> the app's Metrics, once it exists
    # every model's process starts before the first is waited for: they load at once
    starting = [
        (model_id, serve_model(args, model_id, path, defaults, metrics_of))
        for model_id, path in specs
    ]
    for model_id, loaded in starting:
        model = loaded()
        model.glossary = glossaries.get(model_id)
        served.append(model)
    limits = Limits(
        args.max_sentences,
        args.max_chars,
        args.max_beam,
        args.max_output_tokens,
        args.max_work,
        args.client_timeout,
    )
    service = Service(served, served[0].defaults or defaults, limits, keys)  # the default model's
    mode = "batching off" if args.no_batching else f"batches up to {defaults.batch_size} sentences"
    if keys is not None:
        mode += f"; {len(keys)} API keys"

    def ready() -> None:
        names = ", ".join(
            f"{m.id}={m.info['checkpoint']}" if len(served) > 1 else m.info["checkpoint"]
            for m in served
        )
        print(
            f"{PROG}: serving {names} on http://{host}:{port} ({mode}); SIGTERM or Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )

    app = create_app(service, on_startup=ready)
    for model in served:
        metrics_of[model.id] = service.metrics
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=args.shutdown_timeout,
        lifespan="on",
        http=timed_protocol(args.client_timeout),  # a late request head closes its connection
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
            f"{PROG}: stopped; {service.cancelled} request(s) still unanswered after "
            f"--shutdown-timeout {args.shutdown_timeout:g} s were dropped{left}",
            file=sys.stderr,
        )
    else:
        print(
            f"{PROG}: stopped after answering every request it had received{left}", file=sys.stderr
        )


def serve_model(
    args: argparse.Namespace,
    model_id: str,
    path: str,
    defaults: Any,
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
    job = (args, path, defaults, multilingual)
    name = f"model-{model_id}"
    batcher = ModelProcess(load_batcher, job, args.max_queue, record, name=name, wait=False)
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
        info.update(facts, device=device, precision=precision, quantize=args.quantize)
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
    record: Any, args: argparse.Namespace, path: str, defaults: Any, multilingual: bool
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
    from attnmt.server.batcher import Batcher

    model, tokenizer, device = load_model(args, [path])
    defaults, precision = model_decoding(args, defaults, path, device)
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
        wait=args.batch_wait_ms / 1000,
        max_queue=args.max_queue,
        one_request=args.no_batching,
        open_stream=open_stream,
    )
    facts = {"defaults": defaults, "precision": precision, "device": device}
    return batcher, {**facts, **loaded_facts(model, tokenizer)}


def model_decoding(args: argparse.Namespace, defaults: Any, path: str, device: str) -> Any:
    """(the options, the precision) a request to the model at `path` starts from: what
    translate.py -c PATH decodes with, the run's recorded decoding (results.json's) with the
    search flags and --precision applied."""
    defaults, precision, _ = run_decoding(args, defaults, path, device, PROG)
    if defaults.beam_size > args.max_beam:
        raise UserError(
            f"-c {path} decodes with beam {defaults.beam_size}, above --max-beam "
            f"{args.max_beam}; raise --max-beam or pass --beam"
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


def main(argv: list[str] | None = None) -> int:
    from attnmt.common.errors import exit_status

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    return exit_status(PROG, lambda: run(args))
