"""A trained run, loaded to decode: where and how it runs (`RuntimeOptions`), its model on the
device (`load_model`), the language pair and tag its tokenizer is asked for, and the decoding
it uses: each option typed on the command line, else the decoding its training run recorded,
else the option's default (`run_decoding`). What `translate.py`, `serve.py`'s model processes
and `distill.py` load through (`load_run` for the first and last, `load_model` and
`run_decoding` for the server, which checks its own limits between them).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from attnmt.common.errors import UserError
from attnmt.decoding.config import RunDecoding, SearchConfig

if TYPE_CHECKING:
    from attnmt.engine.packing import Packing


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a model runs (`--device`, `--precision`, `--quantize`), what the user
    typed (`given`: the `SearchConfig` field names and "precision" typed on the command line,
    which win over the run's record) and the program name its warnings start with."""

    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"
    quantize: str = "none"  # none | int8
    given: frozenset[str] = frozenset()
    prog: str = "attnmt"
    pack: str = "auto"  # auto | off | all | a comma list of `engine.packing.GROUPS`


class LoadedRun(NamedTuple):
    """What `load_run` loaded: a `Translator`'s arguments, and the precision to autocast to."""

    model: Any  # an `Engine`, or an `Ensemble` of them
    tokenizer: Any  # for the language pair asked for
    search: SearchConfig
    device: str  # the device type: cpu | cuda
    precision: str
    sources: list[str]  # the (first) checkpoint's source languages, in its own codes


def load_run(
    runtime: RuntimeOptions,
    checkpoints: list[str],
    flags: SearchConfig,
    languages: tuple[str | None, str | None] = (None, None),
    tag: str | None = None,
) -> LoadedRun:
    """The checkpoint(s) on the device `runtime` asks for, with the tokenizer of `languages`
    (`--src-lang`, `--tgt-lang`; `language_pair`), `tag` checked against the model's tags, and
    the first checkpoint's decoding with `flags` applied (`run_decoding`: the first run
    decides, as fairseq takes the first model's settings); the decoding goes to stderr when
    the run's record was used."""
    model, tokenizer, device = load_model(runtime, checkpoints)
    sources, targets = checkpoint_languages(checkpoints[0])
    pair = language_pair(*languages, sources, targets, tokenizer.languages)
    tokenizer = tokenizer.for_languages(*pair)
    if tag is not None and tag not in tokenizer.tags:
        known = ", ".join(tokenizer.tags) or "none"
        raise UserError(f"--tag {tag} is not one of this model's tags ({known}); drop it")
    cfg, precision, recorded = run_decoding(runtime, flags, checkpoints[0], device)
    if recorded:
        print(f"{runtime.prog}: decoding: {describe_decoding(cfg, precision)}", file=sys.stderr)
    return LoadedRun(model, tokenizer, cfg, device, precision, sources)


def load_model(runtime: RuntimeOptions, checkpoints: list[str]) -> tuple:
    """(model or ensemble, tokenizer, device type): the device resolved, the options checked
    against it, CPU malloc tuned, the engine loaded."""
    from attnmt.common import runtime as torch_runtime

    device = torch_runtime.resolve_device(runtime.device, "--device", strict_auto=False).type
    check_quantize(runtime.quantize, device, runtime.precision)
    torch_runtime.check_autocast(device, runtime.precision, "--precision")
    pack = check_pack(runtime.pack, device, runtime.quantize)

    from attnmt.common.memory import keep_freed_memory
    from attnmt.engine.load import load_engine

    if device == "cpu":  # the device type: "cpu" or "cuda"
        keep_freed_memory()  # search steps reuse freed blocks instead of page-faulting
    model, tokenizer = load_engine(checkpoints, device, runtime.quantize, pack)
    return model, tokenizer, device


def check_pack(text: str, device: str, quantize: str) -> Packing | None:
    """`--pack` as the engine takes it (None: timed here); packing is for float32 CPU layers."""
    from attnmt.engine.packing import Packing

    try:
        pack = Packing.parse(text)
    except ValueError as e:
        raise UserError(str(e)) from None
    if pack not in (None, Packing()) and (device != "cpu" or quantize != "none"):
        where = "--quantize int8" if quantize != "none" else f"--device {device}"
        raise UserError(f"--pack {text} packs float32 CPU layers, not with {where}; drop --pack")
    return pack


def check_quantize(quantize: str, device: str, precision: str) -> None:
    if quantize == "none":
        return
    if device != "cpu":
        raise UserError(f"--quantize {quantize} runs on the CPU only; add --device cpu")
    if precision != "fp32":
        raise UserError(
            f"--quantize {quantize} computes in int8/fp32; drop --precision {precision}"
        )


def language_pair(
    src_lang: str | None,
    tgt_lang: str | None,
    sources: list[str],
    targets: list[str],
    tokens: list[str],
) -> tuple[str | None, str | None]:
    """--src-lang/--tgt-lang for `Tokenizer.for_languages`: each checked against the
    checkpoint's languages (`sources`, `targets`) by the server's rule
    (`data.languages.match_pair`: any form of the model's own codes), in the model's own
    codes; for a model without language tokens (`tokens`: none), dropped once checked, since
    its one pair needs no telling. A model that names no languages gets them as given (the
    tokenizer refuses them)."""
    if src_lang is None and tgt_lang is None:
        return None, None
    pair = check_language_flags(src_lang, tgt_lang, sources, targets)
    if not tokens and (sources or targets):
        return None, None
    return pair


def check_language_flags(
    src_lang: str | None, tgt_lang: str | None, sources: list[str], targets: list[str]
) -> tuple[str | None, str | None]:
    """--src-lang/--tgt-lang in the model's own codes (`data.languages.match_pair`); a code
    that is none of the model's languages is a `UserError` naming the flag and the pair."""
    from attnmt.data.languages import LanguageError, match_pair

    try:
        return match_pair(src_lang, tgt_lang, sources, targets)
    except LanguageError as e:
        flag = "--src-lang" if e.side == "source" else "--tgt-lang"
        raise UserError(
            f"{flag}: {e}; give one of its languages (any form) or drop {flag}"
        ) from None


def checkpoint_languages(checkpoint: str) -> tuple[list[str], list[str]]:
    """(source codes, target codes) a checkpoint (file or run dir) names, in its own codes
    (`data.languages.model_languages`)."""
    from attnmt.data.languages import model_languages

    return model_languages(_stored(checkpoint))


def _stored(checkpoint: str) -> dict[str, Any]:
    import torch

    from attnmt.checkpoint import resolve_checkpoint

    # load_engine checked the file; mmap reads only the entries looked at
    return torch.load(resolve_checkpoint(checkpoint), mmap=True, weights_only=True)


def run_decoding(
    runtime: RuntimeOptions, flags: SearchConfig, checkpoint: str, device: str
) -> tuple[SearchConfig, str, bool]:
    """(search, precision, whether the run's record was used) to decode `checkpoint` with on
    `device` (a type): each search option (`flags`) and the precision typed on the command
    line (`runtime.given`), else the decoding its training run tested with (the checkpoint's
    "decoding", as in its results.json: `RunDecoding`), else the option's default. The run's
    precision applies on the device type it was tested on and without quantization (int8
    computes in int8/fp32); a checkpoint without a record (older, imported) decodes with the
    defaults. Warnings on stderr start with `runtime.prog`."""
    from attnmt.common import runtime as torch_runtime

    given, prog = runtime.given, runtime.prog
    recorded = stored_decoding(checkpoint)
    if recorded is None:
        warn_emulated_bf16(device, runtime.precision, prog)
        return flags, runtime.precision, False
    values = {
        f.name: getattr(flags if f.name in given else recorded.search, f.name)
        for f in fields(SearchConfig)
    }
    try:
        cfg = SearchConfig(**values)
    except ValueError as e:  # e.g. --nbest above the run's beam
        raise UserError(f"{e} (the run's decoding, flags applied); see --help") from None
    precision = runtime.precision
    if "precision" not in given and runtime.quantize == "none" and recorded.device == device:
        precision = recorded.precision
        dtype = torch_runtime.DTYPES.get(precision)
        if dtype is not None and not torch_runtime.autocast_supported(device, dtype):
            print(
                f"{prog}: warning: the run decoded in {precision}, which torch cannot autocast "
                f"on this {device}: decoding in fp32, so scores may differ from results.json",
                file=sys.stderr,
            )
            precision = "fp32"
    warn_emulated_bf16(device, precision, prog)
    return cfg, precision, True


def warn_emulated_bf16(device: str, precision: str, prog: str) -> None:
    """One line on stderr where bf16 would run emulated: a CPU whose oneDNN has no bf16 (no
    AVX-512, or capped below it), several times slower there (docs/benchmarks.md, "bf16 on
    packed weights")."""
    from attnmt.engine.packing import bf16_packing_runs

    if device == "cpu" and precision == "bf16" and not bf16_packing_runs():
        print(
            f"{prog}: warning: bf16 runs emulated on this CPU (oneDNN has no bf16 here: no "
            "AVX-512), several times slower than fp32; pass --precision fp32 for speed (the "
            "scores may then differ from results.json's by rounding)",
            file=sys.stderr,
        )


def stored_decoding(checkpoint: str) -> RunDecoding | None:
    """The `RunDecoding` a checkpoint (file or run dir) records, or None."""
    try:
        return RunDecoding.from_stored(_stored(checkpoint).get("decoding"))
    except (TypeError, ValueError) as e:
        raise UserError(
            f"the decoding recorded in {checkpoint} is unusable ({e}); use the attnmt version "
            "that wrote it"
        ) from None


def describe_decoding(cfg: SearchConfig, precision: str) -> str:
    """One line of what a search does, for stderr."""
    if cfg.sampling:
        how = (
            f"sampling {cfg.nbest} per sentence (topk {cfg.topk}, topp {cfg.topp:g}, "
            f"temperature {cfg.temperature:g}, seed {cfg.seed})"
        )
    else:
        how = "greedy" if cfg.beam_size == 1 else f"beam {cfg.beam_size}"
        how += f", length penalty {cfg.length_penalty:g} ({cfg.lp_type})"
    return (
        f"{how}, at most {cfg.max_len_a:g} x source + {cfg.max_len_b} tokens, "
        f"{cfg.batch_size} sentences a batch, {precision} (the run's decoding, as its "
        "results.json records it, where no flag says otherwise)"
    )
