"""Build what training needs from the typed config: data, model, optimizer, lr, loss scale.

Free functions, one per thing (Joey NMT's `builders.py`), so the loop in `loop.py` only runs.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
import torch
from torch.nn.parallel import DistributedDataParallel

from attnmt.checkpoint import build_model
from attnmt.common.files import atomic_write
from attnmt.data.batching import BatchIterator, TokenBatchSampler, token_lengths
from attnmt.data.dataset import (
    Corpus,
    DataConfig,
    annotate_terms,
    cache_root,
    corpora,
    encode_split,
    filter_train_pairs_counted,
    load_split,
    tag_sources,
)
from attnmt.data.errors import DataError
from attnmt.data.spm_tokenizer import JOINT_MODEL, SRC_MODEL
from attnmt.data.spm_train import train_or_load_tokenizer
from attnmt.data.terms import annotation_config, read_dictionary
from attnmt.data.tokenizer import Tokenizer, check_tags
from attnmt.model import ModelConfig
from attnmt.training import distributed
from attnmt.training.config import Configs, OptimConfig
from attnmt.training.ema import WeightEMA
from attnmt.training.kernels import use_fast_dropout
from attnmt.training.schedule import inverse_sqrt_warmup, noam
from attnmt.training.state import Progress, Trainee

log = logging.getLogger(__name__)


@dataclass
class Data:
    """The tokenizer and the splits of one run."""

    tokenizer: Tokenizer
    train: datasets.Dataset  # encoded: src/tgt text, src_ids/tgt_ids, src_len/tgt_len
    valid: datasets.Dataset  # encoded
    test: dict[str, datasets.Dataset]  # raw text (src, tgt) per test split
    # Several corpora (data.corpora): (pairs, weight) of each, in `train`'s row order.
    mixture: list[tuple[int, float]] | None = None
    test_langs: dict[str, str] = field(default_factory=dict)  # test split -> target language
    # Training pairs dropped, by rule (empty_side, length_ratio, over_max_len); results.json.
    dropped: dict[str, int] = field(default_factory=dict)


def load_data(
    cfg: Configs,
    run_dir: Path,
    seconds: dict[str, float] | None = None,
    tokenizer: Tokenizer | None = None,
) -> Data:
    """Load and filter the corpus (or each of `data.corpora`, with its tag), train (or reuse)
    SentencePiece, encode (cached on disk).

    The test splits are loaded too, so that a missing one fails before training, not after.
    `seconds`, if given, receives the time of each stage (load, filter, sentencepiece, encode).
    `tokenizer` (a checkpoint's, `trainer.init_from`) is used instead of training one; it is
    saved into the run dir unless one is there.
    """
    data_cfg = cfg.data
    seconds = {} if seconds is None else seconds
    listed = corpora(data_cfg)  # several corpora, or [] for the one `data` names
    terms = annotation_config(data_cfg.term_annotation)  # training sources only
    dictionary = read_dictionary(terms)
    parts = listed or [Corpus("", data_cfg)]
    with _timed(seconds, "load"):
        raws = [load_split(c.data, c.data.train_split) for c in parts]
    dropped = {"empty_side": 0, "length_ratio": 0, "over_max_len": 0}
    with _timed(seconds, "filter"):
        filtered = []
        for raw, c in zip(raws, parts, strict=True):
            kept, counts = filter_train_pairs_counted(raw, c.data)
            kept = annotate_terms(kept, c.data, terms, dictionary)
            filtered.append(tag_sources(kept, c.tag, c.data))
            for rule, n in counts.items():
                dropped[rule] += n
        raws = filtered
    tags = list(dict.fromkeys([*(c.tag for c in parts if c.tag), *terms.markers]))
    with _timed(seconds, "sentencepiece"):
        train_raw = raws[0] if len(raws) == 1 else datasets.concatenate_datasets(raws)
        tokenizer = _run_tokenizer(train_raw, cfg, run_dir, tokenizer, tags)
    with _timed(seconds, "encode"):
        trains = [
            encode_split(raw, tokenizer, c.data, train=True)
            for raw, c in zip(raws, parts, strict=True)
        ]
    dropped["over_max_len"] = sum(len(r) for r in raws) - sum(len(t) for t in trains)
    if not listed:
        with _timed(seconds, "load"):
            valid_raw = load_split(data_cfg, data_cfg.valid_split)
            test = {split: load_split(data_cfg, split) for split in data_cfg.test_splits}
        with _timed(seconds, "encode"):
            valid = encode_split(valid_raw, tokenizer, data_cfg, train=False)
        test_langs = dict.fromkeys(test, data_cfg.tgt_lang)
        mixture = None
        train = trains[0]
    else:
        with _timed(seconds, "load"):
            valid_raws, test, test_langs = _evaluation_splits(listed, data_cfg)
        with _timed(seconds, "encode"):
            valid = datasets.concatenate_datasets(
                [encode_split(raw, tokenizer, data_cfg, train=False) for raw in valid_raws]
            )
        mixture = [(len(t), c.weight) for t, c in zip(trains, listed, strict=True)]
        for (n, _), c in zip(mixture, listed, strict=True):
            if n == 0:
                raise DataError(
                    f"corpus {c.name}: no training pairs within data.max_len={data_cfg.max_len} "
                    "tokens; raise data.max_len or check the corpus"
                )
        train = datasets.concatenate_datasets(trains)
        _log_mixture(listed, mixture)
    log.info(
        "data ready in %.1f s (%s)",
        sum(seconds.values()),
        ", ".join(f"{stage} {s:.1f} s" for stage, s in seconds.items()),
    )
    return Data(tokenizer, train, valid, test, mixture, test_langs, dropped)


def _evaluation_splits(
    listed: list[Corpus], data_cfg: DataConfig
) -> tuple[list[datasets.Dataset], dict[str, datasets.Dataset], dict[str, str]]:
    """The tagged valid splits of `data.valid_from` and test splits of `data.test_from`
    (named `<corpus>.<split>`) with their target languages."""
    by_name = {c.name: c for c in listed}
    valid = [
        tag_sources(load_split(c.data, c.data.valid_split), c.tag, c.data)
        for c in (by_name[n] for n in data_cfg.valid_from)
    ]
    test, langs = {}, {}
    for name in data_cfg.valid_from if data_cfg.test_from is None else data_cfg.test_from:
        c = by_name[name]
        for split in c.data.test_splits:
            test[f"{name}.{split}"] = tag_sources(load_split(c.data, split), c.tag, c.data)
            langs[f"{name}.{split}"] = c.data.tgt_lang
    return valid, test, langs


def _log_mixture(listed: list[Corpus], mixture: list[tuple[int, float]]) -> None:
    total, weights = sum(n for n, _ in mixture), sum(w for _, w in mixture)
    for c, (n, w) in zip(listed, mixture, strict=True):
        drawn = round(total * w / weights)
        log.info(
            "corpus %s: %d pairs, weight %g: %d pairs an epoch (%.2fx)%s",
            c.name,
            n,
            w,
            drawn,
            drawn / n,
            f", tag {c.tag}" if c.tag else "",
        )


def _run_tokenizer(
    train_raw: datasets.Dataset,
    cfg: Configs,
    run_dir: Path,
    given: Tokenizer | None,
    tags: list[str],
) -> Tokenizer:
    """`given` (saved into the run dir unless a model is there: rank 0 writes it first), or
    the run dir's / the cache's / a newly trained SentencePiece model; `tags` (the corpora's)
    are user-defined symbols of a new model and must be ones of an existing model."""
    if given is None:
        settings = cfg.tokenizer
        if tags:
            symbols = list(dict.fromkeys([*settings.user_symbols, *tags]))
            settings = replace(settings, user_symbols=symbols)
        return train_or_load_tokenizer(train_raw, settings, run_dir, cache_root(cfg.data))
    check_tags(given, tags, "the trainer.init_from checkpoint's SentencePiece model")
    if not any((run_dir / name).is_file() for name in (JOINT_MODEL, SRC_MODEL)):
        given.save(run_dir)
    return given


@contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the wall time of the `with` block to `seconds[stage]`."""
    started = time.perf_counter()
    yield
    seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started


def prepare_data(
    cfg: Configs, run_dir: Path, ctx: distributed.DistContext, tokenizer: Tokenizer | None = None
) -> Data:
    """`load_data` on rank 0 first; the other ranks wait, then load its results from the
    caches; no rank goes on until every rank has its data. All waiting is on files in the run
    dir, not in collectives, so however long SentencePiece and encoding take (WMT: many
    minutes), no collective timeout can fire. A rank that fails says so in `.ready/failed`, so
    the others stop with its message instead of waiting (on another node, torchrun could not
    stop them)."""
    if not ctx.enabled:
        return load_data(cfg, run_dir, tokenizer=tokenizer)
    token = distributed.broadcast_object(uuid.uuid4().hex, ctx)  # new for every launch
    ready = run_dir / ".ready"
    failed = ready / "failed"
    try:
        if not ctx.is_main:
            log.info("waiting for rank 0 to prepare the data")
            distributed.wait_for_file(ready / "prepared", token, failed)
        data = load_data(cfg, run_dir, tokenizer=tokenizer)
        if ctx.is_main:
            atomic_write(ready / "prepared", token)
    except Exception as e:
        if not isinstance(e, distributed.PeerFailed):
            atomic_write(failed, f"{token} rank {ctx.rank}: {e}")
        raise
    atomic_write(ready / f"loaded.{ctx.rank}", token)
    for rank in range(ctx.world_size):
        distributed.wait_for_file(ready / f"loaded.{rank}", token, failed)
    return data


def build_trainee(cfg: Configs, tokenizer: Tokenizer, device: torch.device) -> Trainee:
    """A fresh model (`checkpoint.build_model`) with its optimizer, loss scaler, train state."""
    model_cfg = sized_model_config(cfg.model, tokenizer)
    model = use_fast_dropout(build_model(model_cfg, device=device))  # the CPU dropout mask
    log.info("model: %s, %.2fM parameters", model_cfg, model.num_parameters() / 1e6)
    if cfg.trainer.activation_checkpointing:
        model.encoder.checkpoint_activations = model.decoder.checkpoint_activations = True
        log.info("activation checkpointing: each layer recomputed in the backward pass")
    decay = cfg.trainer.ema_decay
    return Trainee(
        model,
        build_optimizer(cfg.optim, model),
        build_scaler(device, cfg.trainer.precision),
        Progress(),
        WeightEMA(model, decay) if decay > 0 else None,
    )


def tokens_per_update(cfg: Configs, ctx: distributed.DistContext) -> int:
    """An update's token budget: processes x `trainer.max_tokens` x `trainer.update_freq`,
    each batch budgeted as its rows x its longest side, padding included."""
    return ctx.world_size * cfg.trainer.max_tokens * cfg.trainer.update_freq


def tokens_per_update_warning(cfg: Configs, world_size: int) -> str | None:
    """One line when the update's token budget is more than 2x off the tokens per update the
    experiment's schedule assumes (`trainer.expected_tokens_per_update`; 0: none stated)."""
    trainer, expected = cfg.trainer, cfg.trainer.expected_tokens_per_update
    actual = world_size * trainer.max_tokens * trainer.update_freq
    if expected <= 0 or expected / 2 <= actual <= expected * 2:
        return None
    freq = max(1, round(expected / (world_size * trainer.max_tokens)))
    return (
        f"tokens per update {actual} ({world_size} process(es) x trainer.max_tokens="
        f"{trainer.max_tokens} x trainer.update_freq={trainer.update_freq}) is "
        f"{actual / expected:.2g}x the {expected} this experiment's schedule assumes "
        f"(trainer.expected_tokens_per_update); set trainer.update_freq={freq} or "
        "trainer.max_tokens so that processes x max_tokens x update_freq is near it"
    )


def train_batches(data: Data, cfg: Configs, ctx: distributed.DistContext) -> BatchIterator:
    """Token-budget training batches of this rank, shuffled per epoch."""
    trainer = cfg.trainer
    sampler = TokenBatchSampler(
        *token_lengths(data.train),
        trainer.max_tokens,
        seed=trainer.seed,
        shuffle=True,
        rank=ctx.rank,
        world_size=ctx.world_size,
        mixture=data.mixture,
        bucket_growth=trainer.bucket_growth,
    )
    stats = sampler.padding_stats()
    log.info(
        "train: %d pairs, %d batches/epoch/rank, %d batch shapes, padding waste %.1f%%",
        len(data.train),
        len(sampler),
        stats["shapes"],
        100 * stats["waste"],
    )
    return BatchIterator(data.train, data.tokenizer.special, sampler)


def valid_batches(data: Data, cfg: Configs, ctx: distributed.DistContext) -> BatchIterator:
    """This rank's share of the validation pairs, in length order."""
    sampler = TokenBatchSampler(
        *token_lengths(data.valid),
        cfg.trainer.max_tokens,
        shuffle=False,
        rank=ctx.rank,
        world_size=ctx.world_size,
        bucket_growth=cfg.trainer.bucket_growth,
    )
    return BatchIterator(data.valid, data.tokenizer.special, sampler)


def sized_model_config(model_cfg: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """`model_cfg` with the tokenizer's vocabulary sizes and padding id."""
    return replace(
        model_cfg,
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        pad_id=tokenizer.special.pad,
    )


def build_optimizer(optim: OptimConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Adam or AdamW. Fused (one kernel for all tensors; its step counters stay on the device,
    so an update reads nothing back to the host) on CUDA and CPU."""
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return cls(
        model.parameters(),
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=True,
    )


def learning_rate(step: int, optim: OptimConfig, d_model: int) -> float:
    """The scheduled lr of update `step` (counted from 1)."""
    if optim.schedule == "noam":
        return noam(step, d_model, optim.warmup_steps, optim.noam_factor)
    return inverse_sqrt_warmup(step, optim.lr, optim.warmup_steps)


def build_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling for fp16 (a no-op object otherwise)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def wrap_model(
    model: torch.nn.Module,
    ctx: distributed.DistContext,
    compile: bool,
    backend: str = "inductor",
) -> torch.nn.Module:
    """The model training runs: `compiled_layers` if asked, then DDP under torchrun. `model`
    itself stays eager (validation and decoding use it)."""
    wrapped = compiled_layers(model, backend) if compile else model
    if ctx.enabled:
        ids = None if ctx.device.type == "cpu" else [ctx.device.index]
        wrapped = DistributedDataParallel(wrapped, device_ids=ids)
    return wrapped


def compiled_layers(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """A view of `model` that shares its modules and parameters, with each encoder and decoder
    layer `torch.compile`d (regional compilation, as torchtitan does): the layers of a stack
    share one graph, their weights being its inputs, so the compile costs one layer of each kind
    rather than the whole model (a quarter to half the wait on the CPU:
    docs/benchmarks.md#torchcompile-in-training).
    Dynamic shapes: batches vary. `backend`: "eager" traces without code generation (tests)."""
    view = copy.copy(model)
    view._modules = dict(model._modules)
    for name in ("encoder", "decoder"):
        stack = copy.copy(getattr(model, name))
        stack._modules = dict(stack._modules)
        stack.layers = torch.nn.ModuleList(
            torch.compile(layer, dynamic=True, backend=backend) for layer in stack.layers
        )
        setattr(view, name, stack)
    # Duck sizing gives sizes that are equal in the first batch (S == T, B == S) one symbol,
    # so the first batch where they differ recompiles: off while tracing, so that every batch
    # with B, S, T >= 2 runs one graph a layer kind (B = 1 or T = 1 adds one: 0/1 is special).
    no_duck = torch.fx.experimental._config.patch(use_duck_shape=False)
    view.forward = no_duck(view.forward)
    return view
