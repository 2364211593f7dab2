"""Train our SentencePiece tokenizer on the training split, or reuse one trained before.

:func:`train_or_load_tokenizer` looks in the run dir (resume), then in a cache of trained
models keyed by the split and every setting that changes the model, and trains only when
neither has one; the model is saved into the run dir (see ``data/spm_tokenizer.py``).
"""

from __future__ import annotations

import hashlib
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm
from tqdm import tqdm

from attnmt.data.errors import DataError
from attnmt.data.spm_tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL, SpmTokenizer
from attnmt.data.tokenizer import SpecialIds, Tokenizer, check_tag, check_tags

if TYPE_CHECKING:  # inference never needs `datasets` (it costs ~1 s to import)
    import datasets

log = logging.getLogger(__name__)

MODEL_TYPES = ("unigram", "bpe")
# Fixed seed for SentencePiece's sentence sampling: every data-parallel rank (and every rerun)
# that trains on the same corpus gets the same model.
_SPM_SEED = 1234
# Rows read from Arrow at a time while streaming sentences to the trainer.
_STREAM_BATCH = 10_000


@dataclass
class TokenizerConfig:
    """Hydra group ``tokenizer`` (one key per field).

    Attributes:
        vocab_size: Pieces per model (for each of the two models when ``joint`` is False).
        model_type: ``unigram`` (Kudo 2018, SentencePiece's default) or ``bpe``.
        joint: One model for source and target (shared vocabulary) instead of two.
        character_coverage: Fraction of characters covered by the model; 1.0 suits alphabetic
            scripts, 0.9995 is SentencePiece's advice for CJK.
        input_sentence_size: At most this many sentences per side (source, target), sampled
            from the training split, train a model; bounds memory on WMT-sized corpora.
            0 means all; SentencePiece rejects 1 to 100.
        pad_id: Id of ``<pad>``. unk_id: ``<unk>``. bos_id: ``<s>``. eos_id: ``</s>``.
        user_symbols: Tags (e.g. ``<2de>``, ``<BT>``) made SentencePiece user-defined symbols,
            so each is one piece; the corpora's tags (``data.corpora.*.tag``) are added to
            these. Reserve here the tags a later fine-tuning run will need.
        src_lang, tgt_lang: The language pair, in the model's own codes, when fine-tuning an
            imported multilingual model (``trainer.init_from``; see
            :meth:`Tokenizer.for_languages`); None for every other model.
    """

    vocab_size: int = 8000
    model_type: str = "unigram"
    joint: bool = True
    character_coverage: float = 1.0
    input_sentence_size: int = 1_000_000
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    user_symbols: list[str] = field(default_factory=list)
    src_lang: str | None = None
    tgt_lang: str | None = None

    def __post_init__(self) -> None:
        for tag in self.user_symbols:
            check_tag(tag, "tokenizer.user_symbols")
        if self.model_type not in MODEL_TYPES:
            raise DataError(
                f"tokenizer.model_type={self.model_type!r} is not supported; "
                f"use one of {', '.join(MODEL_TYPES)}"
            )
        if 0 < self.input_sentence_size <= 100:
            raise DataError(
                f"tokenizer.input_sentence_size={self.input_sentence_size} is too small for "
                "SentencePiece; use 0 (all sentences) or more than 100"
            )
        ids = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        if len(set(ids)) != 4 or min(ids) < 0 or max(ids) >= self.vocab_size:
            raise DataError(
                f"tokenizer special ids pad={self.pad_id} unk={self.unk_id} bos={self.bos_id} "
                f"eos={self.eos_id} must be distinct and in [0, vocab_size={self.vocab_size}); "
                "fix tokenizer.pad_id/unk_id/bos_id/eos_id"
            )

    @property
    def special(self) -> SpecialIds:
        """The special ids this config asks for."""
        return SpecialIds(self.pad_id, self.unk_id, self.bos_id, self.eos_id)


def train_or_load_tokenizer(
    train: datasets.Dataset,
    cfg: TokenizerConfig,
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
) -> SpmTokenizer:
    """Reuse the model file(s) in ``out_dir`` (resume), else a model trained earlier on the
    same split with the same settings (``cache_dir``, written by ``scripts/prepare_data.py``
    or any earlier run), else train on ``train``; the model is saved into ``out_dir`` (and
    ``cache_dir``).

    With data parallelism call it on rank 0 first and let the other ranks load after a
    barrier: concurrent calls are safe (atomic writes, seeded sampling) but train N times.

    Args:
        train: Training split with string columns ``src`` and ``tgt``.
        cfg: Tokenizer settings; the special ids of a reused model must match them.
        out_dir: The run dir.
        cache_dir: Where trained models are kept, keyed by the split's fingerprint and every
            setting that changes the model; None: no cache.

    Returns:
        The tokenizer, whose model file(s) are now in ``out_dir``.

    Raises:
        DataError: A saved model disagrees with ``cfg`` (special ids, joint/separate), or
            SentencePiece cannot train (e.g. ``vocab_size`` too large for the corpus).
    """
    out_dir = Path(out_dir)
    tokenizer = _load_saved(out_dir, cfg)
    if tokenizer is not None:
        log.info("reusing SentencePiece model(s) in %s", out_dir)
        return tokenizer
    cached = Path(cache_dir) / "spm" / _cache_key(train, cfg) if cache_dir else None
    if cached is not None and (tokenizer := _load_saved(cached, cfg)) is not None:
        log.info("reusing the SentencePiece model(s) prepared in %s", cached)
        tokenizer.save(out_dir)
        return tokenizer
    if cfg.joint:
        log.info(
            "training joint SentencePiece %s model (%d pieces)", cfg.model_type, cfg.vocab_size
        )
        tokenizer = SpmTokenizer(_train_model(train, ("src", "tgt"), cfg))
    else:
        log.info("training separate SentencePiece %s models", cfg.model_type)
        tokenizer = SpmTokenizer(
            _train_model(train, ("src",), cfg), _train_model(train, ("tgt",), cfg)
        )
    _check_special(tokenizer, cfg, "the trained model")
    if cached is not None:
        tokenizer.save(cached)
    tokenizer.save(out_dir)
    return tokenizer


def _cache_key(train: datasets.Dataset, cfg: TokenizerConfig) -> str:
    """The training split's fingerprint plus every setting and input that changes the model."""
    settings = asdict(cfg)
    for key in ("user_symbols", "src_lang", "tgt_lang"):  # keys of models trained before
        if not settings[key]:  # these settings existed stay valid
            del settings[key]
    parts = (train._fingerprint, sorted(settings.items()), _SPM_SEED, spm.__version__)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:20]


def _load_saved(out_dir: Path, cfg: TokenizerConfig) -> SpmTokenizer | None:
    joint, src, tgt = out_dir / JOINT_MODEL, out_dir / SRC_MODEL, out_dir / TGT_MODEL
    if cfg.joint and joint.exists():
        tokenizer = SpmTokenizer(joint.read_bytes())
        where = str(joint)
    elif not cfg.joint and src.exists() and tgt.exists():
        tokenizer = SpmTokenizer(src.read_bytes(), tgt.read_bytes())
        where = f"{src} and {tgt}"
    elif joint.exists() or src.exists() or tgt.exists():
        found = ", ".join(p.name for p in (joint, src, tgt) if p.exists())
        raise DataError(
            f"{out_dir} holds {found}, which does not match tokenizer.joint={cfg.joint}; "
            "set tokenizer.joint to match the saved model(s) or use a fresh run dir"
        )
    else:
        return None
    _check_special(tokenizer, cfg, where)
    check_tags(tokenizer, cfg.user_symbols, where)
    if tokenizer.src_vocab_size != cfg.vocab_size:
        log.warning(
            "%s has %d pieces but tokenizer.vocab_size=%d; keeping the saved model",
            where,
            tokenizer.src_vocab_size,
            cfg.vocab_size,
        )
    return tokenizer


def _check_special(tokenizer: Tokenizer, cfg: TokenizerConfig, where: str) -> None:
    if tokenizer.special != cfg.special:
        s = tokenizer.special
        raise DataError(
            f"{where} has special ids pad={s.pad} unk={s.unk} bos={s.bos} eos={s.eos} but the "
            f"config asks for pad={cfg.pad_id} unk={cfg.unk_id} bos={cfg.bos_id} "
            f"eos={cfg.eos_id}; set tokenizer.*_id to match or delete the model to retrain"
        )


def _iter_sentences(train: datasets.Dataset, columns: tuple[str, ...]) -> Iterator[str]:
    """Stream sentences from the memory-mapped split, a batch of rows at a time."""
    for batch in train.select_columns(list(columns)).iter(batch_size=_STREAM_BATCH):
        for column in columns:
            for text in batch[column]:
                if text:  # None or "" teach SentencePiece nothing
                    yield text


def _train_model(train: datasets.Dataset, columns: tuple[str, ...], cfg: TokenizerConfig) -> bytes:
    """Train one model on ``columns`` of ``train``; returns the serialized model proto.

    SentencePiece reads from the iterator and keeps a uniform sample of
    ``input_sentence_size`` sentences per column (reservoir sampling,
    ``shuffle_input_sentence``), so memory is bounded by the sample, not the corpus.
    """
    model = io.BytesIO()
    spm.set_random_generator_seed(_SPM_SEED)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(
                tqdm(
                    _iter_sentences(train, columns),
                    desc="SentencePiece: reading sentences",
                    total=len(train) * len(columns),
                    unit=" sent",
                    disable=not sys.stderr.isatty(),  # a bar on a terminal only
                )
            ),
            model_writer=model,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            input_sentence_size=cfg.input_sentence_size * len(columns),  # per side
            shuffle_input_sentence=True,
            pad_id=cfg.pad_id,
            unk_id=cfg.unk_id,
            bos_id=cfg.bos_id,
            eos_id=cfg.eos_id,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            minloglevel=2,  # errors only: the INFO log is hundreds of lines per model
            **({"user_defined_symbols": cfg.user_symbols} if cfg.user_symbols else {}),
        )
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise DataError(
            f"SentencePiece training failed: {reason}; lower tokenizer.vocab_size or use a "
            "larger training corpus"
        ) from e
    return model.getvalue()
