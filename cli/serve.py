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
import logging

from attnmt.cli.args import Parser, number, program_name
from attnmt.cli.translate import add_runtime_flags, add_search_flags, search_from_flags
from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.server.hosting import ModelProcessOptions, ServeOptions, serve
from attnmt.server.service import Limits

PROG = program_name("serve.py")


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


def run(args: argparse.Namespace) -> None:
    """Check the flags that go together, then serve (`server.hosting.serve`)."""
    defaults = search_from_flags(args)
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
    serve(serve_options(args, defaults))


def serve_options(args: argparse.Namespace, defaults: SearchConfig) -> ServeOptions:
    """The flags as `ServeOptions`; `defaults`: the search flags' (`search_from_flags`)."""
    model = ModelProcessOptions(
        args.device, args.precision, args.quantize, getattr(args, "given", frozenset()),
        args.max_beam, args.max_queue, args.batch_wait_ms, args.no_batching, PROG, args.pack,
    )  # fmt: skip
    limits = Limits(
        args.max_sentences, args.max_chars, args.max_beam, args.max_output_tokens,
        args.max_work, args.client_timeout,
    )  # fmt: skip
    return ServeOptions(
        tuple(args.checkpoint), defaults, model, limits, args.host, args.port,
        tuple(args.glossary or ()), args.api_keys, args.key_rate, args.shutdown_timeout,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from attnmt.common.errors import exit_status

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    return exit_status(PROG, lambda: run(args))
