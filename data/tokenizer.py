"""SentencePiece tokenizer: train on the training split, save into the run dir, encode/decode.

One model is shared by source and target by default (``joint``), as in the Transformer paper's
shared BPE vocabulary (Vaswani et al. 2017, sec. 5.1); separate models are an option. The
special ids are set explicitly because SentencePiece's defaults (unk 0, bos 1, eos 2, no pad)
differ from the ones the model code assumes (pad 0, unk 1, bos 2, eos 3).

A run dir holds ``spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model`` (separate), plus
the matching human-readable ``.vocab`` files. Checkpoints hold the same model bytes through
:meth:`Tokenizer.state_dict`, so translation needs nothing else.

An imported model (``scripts/import_hf.py``: OPUS-MT, NLLB) keeps its own ids: a
:class:`Vocabulary` maps SentencePiece's pieces to the model's ids (Marian's ``vocab.json``,
NLLB's fairseq offset) and says where its language tokens go (:meth:`Tokenizer.for_languages`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm
from tqdm import tqdm

from attnmt.common.files import atomic_write

from .errors import DataError

if TYPE_CHECKING:  # inference never needs `datasets` (it costs ~1 s to import)
    import datasets

log = logging.getLogger(__name__)

JOINT_MODEL = "spm.model"
SRC_MODEL = "spm.src.model"
TGT_MODEL = "spm.tgt.model"
IMPORTED_TOKENIZER = "tokenizer.pt"  # an imported model's tokenizer state (scripts/import_hf.py)
MODEL_TYPES = ("unigram", "bpe")
_STATE_FORMAT = "attnmt.sentencepiece"
_STATE_VERSION = 1
_VOCAB_STATE_VERSION = 2  # with a Vocabulary: code that ignored it would give wrong ids
# Fixed seed for SentencePiece's sentence sampling: every data-parallel rank (and every rerun)
# that trains on the same corpus gets the same model.
_SPM_SEED = 1234
# Rows read from Arrow at a time while streaming sentences to the trainer.
_STREAM_BATCH = 10_000


@dataclass
class SpecialIds:
    """Ids of the special tokens; the model, batching and search all read them from here."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3


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


def check_tag(tag: object, key: str) -> None:
    """A tag is one whitespace-free word (``<2de>``, ``<BT>``): it starts a source line."""
    if not isinstance(tag, str) or not tag or any(c.isspace() for c in tag):
        raise DataError(f"{key}: tag {tag!r} must be one word without spaces, e.g. <2de> or <BT>")


@dataclass
class Vocabulary:
    """The ids of an imported model, which are not SentencePiece's own.

    Attributes:
        src: id -> piece of the source side; ``tgt``: of the target side (the same list when
            the model shares one vocabulary). Pieces missing here encode as ``special.unk``.
        special: The model's special ids; ``bos`` is the token the decoder starts from
            (OPUS-MT: ``<pad>``, whose embedding is zero; NLLB: ``</s>``).
        languages: Language code -> the id of its token (OPUS-MT ``deu`` -> ``>>deu<<``;
            NLLB ``deu_Latn``).
        convention: Where language tokens go. ``marian``: the target language's token starts
            the source (multi-target OPUS-MT models). ``nllb``: the source language's token
            starts the source, the target language's token starts the target (forced and
            not printed; it scores 0, as Transformers' ``forced_bos_token_id``).
        src_lang, tgt_lang: The languages ``encode_src`` and ``target_prefix`` use when
            none are given (set by ``for_languages``; stored with fine-tuned models).
    """

    src: list[str]
    tgt: list[str]
    special: SpecialIds
    languages: dict[str, int] = field(default_factory=dict)
    convention: str = "marian"
    src_lang: str | None = None
    tgt_lang: str | None = None

    def state_dict(self) -> dict:
        state = asdict(self)
        state["tgt"] = None if self.tgt is self.src else self.tgt
        return state

    @classmethod
    def from_state_dict(cls, state: dict) -> Vocabulary:
        state = dict(state)
        state["special"] = SpecialIds(**state["special"])
        if state["tgt"] is None:
            state["tgt"] = state["src"]
        return cls(**state)


def _user_symbols(model: bytes) -> list[str]:
    """The user-defined symbols of a serialized SentencePiece model (its tags)."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError:  # protobuf missing: no tags can be read, so none are split off
        return []
    proto = pb.ModelProto()
    proto.ParseFromString(model)
    user = pb.ModelProto.SentencePiece.USER_DEFINED
    return [p.piece for p in proto.pieces if p.type == user]


def _special_of(processor: spm.SentencePieceProcessor) -> SpecialIds:
    return SpecialIds(
        processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()
    )


def _load_proto(model: bytes, name: str, any_special: bool = False) -> spm.SentencePieceProcessor:
    """`any_special`: an imported model's, whose special ids come from its vocabulary."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model)
    except (RuntimeError, OSError) as e:
        raise DataError(
            f"{name} is not a valid SentencePiece model ({e}); delete it to retrain"
        ) from e
    if not any_special and min(asdict(_special_of(processor)).values()) < 0:
        # A model trained elsewhere without a pad piece cannot pad batches.
        raise DataError(
            f"{name} lacks one of pad/unk/bos/eos (ids {_special_of(processor)}); "
            "retrain it with train_or_load_tokenizer"
        )
    return processor


class Tokenizer:
    """Source and target SentencePiece models (the same object when ``joint``).

    Encoding adds no specials: batching appends ``eos`` to sources and builds the target's
    ``[bos] + y`` / ``y + [eos]`` pair (see ``data/batching.py``).

    Args:
        src_model: Serialized SentencePiece model proto for the source side (or both sides).
        tgt_model: Serialized target model; None means one joint model.
        vocab: An imported model's ids (None: SentencePiece's ids, ours).
    """

    def __init__(
        self, src_model: bytes, tgt_model: bytes | None = None, vocab: Vocabulary | None = None
    ) -> None:
        self.vocab = vocab
        if vocab is not None:
            self._init_vocab(src_model, tgt_model, vocab)
            return
        self.joint = tgt_model is None
        self._src_bytes = bytes(src_model)
        self._tgt_bytes = None if tgt_model is None else bytes(tgt_model)
        self._src = _load_proto(self._src_bytes, "source SentencePiece model")
        self._tgt = (
            self._src
            if self._tgt_bytes is None
            else _load_proto(self._tgt_bytes, "target SentencePiece model")
        )
        self.special: SpecialIds = _special_of(self._src)
        if _special_of(self._tgt) != self.special:
            raise DataError(
                f"source and target SentencePiece models disagree on special ids "
                f"({self.special} vs {_special_of(self._tgt)}); retrain them together"
            )
        self.src_vocab_size: int = self._src.get_piece_size()
        self.tgt_vocab_size: int = self._tgt.get_piece_size()
        # Tags (user-defined symbols of the source model) -> their ids.
        self.tags: dict[str, int] = {
            tag: self._src.piece_to_id(tag) for tag in _user_symbols(self._src_bytes)
        }

    def _init_vocab(self, src_model: bytes, tgt_model: bytes | None, vocab: Vocabulary) -> None:
        """An imported model: SentencePiece segments, `vocab` numbers the pieces."""
        self.joint = vocab.tgt is vocab.src
        self._src_bytes = bytes(src_model)
        self._tgt_bytes = None if tgt_model is None else bytes(tgt_model)
        self._src = _load_proto(self._src_bytes, "source SentencePiece model", any_special=True)
        self._tgt = (
            self._src
            if self._tgt_bytes is None
            else _load_proto(self._tgt_bytes, "target SentencePiece model", any_special=True)
        )
        self.special = vocab.special
        self.src_vocab_size, self.tgt_vocab_size = len(vocab.src), len(vocab.tgt)
        self._src_ids = {piece: i for i, piece in enumerate(vocab.src)}
        self._tgt_ids = self._src_ids if self.joint else {p: i for i, p in enumerate(vocab.tgt)}
        # Language tokens in the text (`>>deu<< A man ...`) are one id each, as tags are.
        self.tags = {vocab.src[i]: i for i in vocab.languages.values() if i < len(vocab.src)}
        # Never text: specials, language tokens and pieces SentencePiece does not know.
        self._hidden = set(vars(self.special).values()) | set(vocab.languages.values())

    # --- languages of an imported multilingual model ------------------------------------------

    @property
    def languages(self) -> list[str]:
        """The language codes of a multilingual imported model ([] for any other)."""
        return [] if self.vocab is None else sorted(self.vocab.languages)

    def for_languages(self, src_lang: str | None, tgt_lang: str | None) -> Tokenizer:
        """This tokenizer for one language pair (None: the one it has, if any): what
        `encode_src` and `target_prefix` then add. Itself when nothing changes.

        Raises:
            DataError: a code the model lacks (the message lists the ones it has), a model
                without language codes given one, or a missing code the model needs.
        """
        vocab = self.vocab
        if vocab is None or not vocab.languages:
            if src_lang is not None or tgt_lang is not None:
                raise DataError(
                    f"this model has no language codes, so a language pair "
                    f"({src_lang or '-'} -> {tgt_lang or '-'}) means nothing to it; drop "
                    "--src-lang/--tgt-lang (tokenizer.src_lang/tgt_lang)"
                )
            return self
        src_lang = src_lang if src_lang is not None else vocab.src_lang
        tgt_lang = tgt_lang if tgt_lang is not None else vocab.tgt_lang
        needed = ("source", "target") if vocab.convention == "nllb" else ("target",)
        for side, code in (("source", src_lang), ("target", tgt_lang)):
            if code is None and side in needed:
                key = "src_lang" if side == "source" else "tgt_lang"
                raise DataError(
                    f"this model translates between several languages: name the {side} "
                    f"language (--{key.replace('_', '-')}; tokenizer.{key} when fine-tuning), "
                    f"one of {_codes(vocab.languages)}"
                )
            if code is not None and side in needed and code not in vocab.languages:
                raise DataError(
                    f"unknown {side} language {code!r}: this model has {_codes(vocab.languages)}"
                )
        if (src_lang, tgt_lang) == (vocab.src_lang, vocab.tgt_lang):
            return self
        bound = replace(vocab, src_lang=src_lang, tgt_lang=tgt_lang)
        return Tokenizer(self._src_bytes, self._tgt_bytes, bound)

    def source_prefix(self) -> list[int]:
        """Ids that start every source: a language token (NLLB: the source language's;
        multi-target OPUS-MT: the target language's), or nothing."""
        vocab = self.vocab
        if vocab is None or not vocab.languages:
            return []
        code = vocab.src_lang if vocab.convention == "nllb" else vocab.tgt_lang
        return [] if code is None else [vocab.languages[code]]

    def target_prefix(self) -> list[int]:
        """Ids that start every target and are given, not predicted (NLLB's target language
        token): forced by search, left out of the output, scored 0."""
        vocab = self.vocab
        if vocab is None or vocab.convention != "nllb" or vocab.tgt_lang is None:
            return []
        return [vocab.languages[vocab.tgt_lang]]

    # --- text <-> ids -------------------------------------------------------------------------

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source texts -> ids, without bos/eos.

        Tags (``<2de> A man ...``: user-defined symbols, see :attr:`tags`) at the start of a
        text, each followed by a space, become one id each, and the rest is encoded as if it
        stood alone; SentencePiece itself would add a ``▁`` piece before the tag and change
        the first word's pieces."""
        if self.vocab is not None:
            prefix = self.source_prefix()
            return [prefix + ids for ids in self._encode_pieces(texts, source=True)]
        if not self.tags or isinstance(texts, str):
            return _encode(self._src, texts)
        heads, bodies = [], []
        for text in texts:
            head = []
            word, _, rest = text.partition(" ")
            while word in self.tags:
                head.append(self.tags[word])
                text = rest
                word, _, rest = text.partition(" ")
            heads.append(head)
            bodies.append(text)
        return [head + ids for head, ids in zip(heads, _encode(self._src, bodies), strict=True)]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target texts -> ids, without bos/eos (and without `target_prefix`)."""
        if self.vocab is not None:
            return self._encode_pieces(texts, source=False)
        return _encode(self._tgt, texts)

    def _encode_pieces(self, texts: list[str], source: bool) -> list[list[int]]:
        """An imported model's ids: SentencePiece's pieces looked up in its vocabulary (as
        Transformers' Marian and NLLB tokenizers do); language tokens that start a source
        text are one id each."""
        if isinstance(texts, str):
            raise TypeError("encode_src/encode_tgt take a list of strings, not a string")
        processor, ids = (self._src, self._src_ids) if source else (self._tgt, self._tgt_ids)
        unk = self.special.unk
        out = []
        for text in texts:
            head = []
            while source and text.startswith(">>") and (end := text.find("<<")) != -1:
                if text[: end + 2] not in self.tags:
                    break
                head.append(self.tags[text[: end + 2]])
                text = text[end + 2 :]
            pieces = processor.encode(text, out_type=str)
            out.append(head + [ids.get(piece, unk) for piece in pieces])
        return out

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Target ids -> detokenized text; stops at the first eos and drops pad/bos."""
        if self.vocab is not None:
            return self._decode_pieces(ids, self.vocab.tgt, self._tgt)
        return self._tgt.decode([self._strip_specials(seq) for seq in ids])

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        """Source ids -> detokenized text (for logging sample inputs)."""
        if self.vocab is not None:
            return self._decode_pieces(ids, self.vocab.src, self._src)
        return self._src.decode([self._strip_specials(seq) for seq in ids])

    def _decode_pieces(
        self, ids: list[list[int]], pieces: list[str], processor: spm.SentencePieceProcessor
    ) -> list[str]:
        """An imported model's ids -> text: specials and language tokens dropped, the rest
        joined by SentencePiece (ids past the vocabulary, NLLB's spare rows, are dropped)."""
        texts = []
        for seq in ids:
            kept = []
            for token in seq:
                token = int(token)
                if token == self.special.eos:
                    break
                if token not in self._hidden and token < len(pieces):
                    kept.append(pieces[token])
            texts.append(processor.decode_pieces(kept))
        return texts

    def _strip_specials(self, seq: list[int]) -> list[int]:
        out = []
        for token in seq:
            token = int(token)  # accepts numpy/torch integer scalars too
            if token == self.special.eos:
                break  # anything after eos is padding or search leftovers
            if token not in (self.special.pad, self.special.bos):
                out.append(token)
        return out

    def src_pieces(self, ids: list[int]) -> list[str]:
        """Source ids -> pieces (attention-plot axis labels); specials shown as ``</s>`` etc."""
        if self.vocab is not None:
            return [_piece(self.vocab.src, i) for i in ids]
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """Target ids -> pieces (attention-plot axis labels)."""
        if self.vocab is not None:
            return [_piece(self.vocab.tgt, i) for i in ids]
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    # --- persistence --------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """Hash of the model bytes: names encoded-corpus caches (see ``data/dataset.py``)."""
        digest = hashlib.sha256(self._src_bytes)
        digest.update(self._tgt_bytes or b"joint")
        if self.vocab is not None:  # the ids and the languages change the encoded corpus
            digest.update(repr(self.vocab.state_dict()).encode())
        return digest.hexdigest()[:16]

    def state_dict(self) -> dict:
        """Plain types only, so it survives ``torch.load(weights_only=True)``."""
        state: dict = {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "joint": self.joint,
            "src_model": self._src_bytes,
        }
        if self._tgt_bytes is not None:
            state["tgt_model"] = self._tgt_bytes
        if self.vocab is not None:
            state["version"] = _VOCAB_STATE_VERSION
            state["vocab"] = self.vocab.state_dict()
        return state

    @classmethod
    def from_state_dict(cls, state: dict) -> Tokenizer:
        """Rebuild from :meth:`state_dict` (e.g. a checkpoint's ``tokenizer`` entry)."""
        versions = (_STATE_VERSION, _VOCAB_STATE_VERSION)
        if state.get("format") != _STATE_FORMAT or state.get("version") not in versions:
            raise DataError(
                f"tokenizer state has format {state.get('format')!r} version "
                f"{state.get('version')!r}, expected {_STATE_FORMAT!r} version {_STATE_VERSION} "
                f"or {_VOCAB_STATE_VERSION}; the checkpoint comes from an incompatible version "
                "of attnmt"
            )
        tgt_model = state.get("tgt_model")
        if "vocab" in state:
            return cls(state["src_model"], tgt_model, Vocabulary.from_state_dict(state["vocab"]))
        return cls(state["src_model"], None if state["joint"] else tgt_model)

    def save(self, out_dir: str | Path) -> None:
        """Write ``spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model``, with vocabs;
        an imported model's tokenizer: ``tokenizer.pt`` (its state)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.vocab is not None:
            import torch  # the state holds bytes and lists: a safe torch.save / weights_only load

            atomic_write(out_dir / IMPORTED_TOKENIZER, lambda f: torch.save(self.state_dict(), f))
            return
        if self._tgt_bytes is None:
            _write_model(out_dir / JOINT_MODEL, self._src_bytes, self._src)
        else:
            _write_model(out_dir / SRC_MODEL, self._src_bytes, self._src)
            _write_model(out_dir / TGT_MODEL, self._tgt_bytes, self._tgt)

    # Pickle through the model bytes: ``datasets.map(num_proc>1)`` sends the tokenizer to
    # worker processes.
    def __getstate__(self) -> dict:
        return self.state_dict()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(Tokenizer.from_state_dict(state).__dict__)


def _piece(pieces: list[str], i: int) -> str:
    i = int(i)
    return pieces[i] if 0 <= i < len(pieces) else f"<{i}>"


def _codes(languages: dict[str, int]) -> str:
    codes = sorted(languages)
    shown = ", ".join(codes[:30])
    return f"{len(codes)} codes: {shown}" + (", ..." if len(codes) > 30 else "")


def _encode(processor: spm.SentencePieceProcessor, texts: list[str]) -> list[list[int]]:
    if isinstance(texts, str):
        # SentencePiece would silently return one flat list; callers expect one list per text.
        raise TypeError("encode_src/encode_tgt take a list of strings, not a string")
    return processor.encode(list(texts), out_type=int)


def _write_model(path: Path, model: bytes, processor: spm.SentencePieceProcessor) -> None:
    """Atomic write (temp file + rename) so a killed run never leaves half a model behind."""
    atomic_write(path, model)
    vocab = "".join(
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
        for i in range(processor.get_piece_size())
    )
    atomic_write(path.with_suffix(".vocab"), vocab.encode("utf-8"))


# --- training -------------------------------------------------------------------------------


def train_or_load_tokenizer(
    train: datasets.Dataset,
    cfg: TokenizerConfig,
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
) -> Tokenizer:
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
        tokenizer = Tokenizer(_train_model(train, ("src", "tgt"), cfg))
    else:
        log.info("training separate SentencePiece %s models", cfg.model_type)
        tokenizer = Tokenizer(
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


def _load_saved(out_dir: Path, cfg: TokenizerConfig) -> Tokenizer | None:
    joint, src, tgt = out_dir / JOINT_MODEL, out_dir / SRC_MODEL, out_dir / TGT_MODEL
    if cfg.joint and joint.exists():
        tokenizer = Tokenizer(joint.read_bytes())
        where = str(joint)
    elif not cfg.joint and src.exists() and tgt.exists():
        tokenizer = Tokenizer(src.read_bytes(), tgt.read_bytes())
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


def check_tags(tokenizer: Tokenizer, tags: list[str], where: str) -> None:
    """Every tag must be one of the tokenizer's user-defined symbols (else it would be split
    into pieces, and mean nothing to the model)."""
    unknown = [tag for tag in tags if tag not in tokenizer.tags]
    if unknown:
        known = ", ".join(tokenizer.tags) or "none"
        reserve = ",".join(f"'{tag}'" for tag in unknown)
        raise DataError(
            f"unknown tag(s) {', '.join(unknown)}: {where} has no such SentencePiece symbol "
            f"(its tags: {known}); use a fresh run dir to train a model with them, or reserve "
            f'them with "tokenizer.user_symbols=[{reserve}]" when training the model you start '
            "from"
        )


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
