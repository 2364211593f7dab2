"""The tokenizer interface: text <-> ids, the special ids and the state a checkpoint keeps.

Both tokenizers segment text with SentencePiece; they differ in how pieces become ids:

- :class:`~attnmt.data.spm_tokenizer.SpmTokenizer`: our own model(s), trained on the training
  split (``data/spm_train.py``); the ids are SentencePiece's.
- :class:`~attnmt.data.vocab_tokenizer.VocabTokenizer`: an imported model
  (``scripts/import_hf.py``: OPUS-MT, NLLB), whose own vocabulary numbers the pieces and names
  its language tokens.

:func:`attnmt.data.tokenizers.load_tokenizer` rebuilds the right one from
:meth:`Tokenizer.state_dict` (a checkpoint's ``tokenizer`` entry), so translation needs
nothing else.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from attnmt.data.errors import DataError

# Every tokenizer state has this format: one or two SentencePiece models (plus, for an imported
# model, its vocabulary); the classes tell theirs apart by version.
STATE_FORMAT = "attnmt.sentencepiece"


@dataclass
class SpecialIds:
    """Ids of the special tokens; the model, batching and search all read them from here."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3


def check_tag(tag: object, key: str) -> None:
    """A tag is one whitespace-free word (``<2de>``, ``<BT>``): it starts a source line."""
    if not isinstance(tag, str) or not tag or any(c.isspace() for c in tag):
        raise DataError(f"{key}: tag {tag!r} must be one word without spaces, e.g. <2de> or <BT>")


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


def check_texts(texts: list[str]) -> None:
    """SentencePiece would silently encode a bare string as one text and return one flat list;
    callers expect one list per text."""
    if isinstance(texts, str):
        raise TypeError("encode_src/encode_tgt take a list of strings, not a string")


class Tokenizer(ABC):
    """Source and target SentencePiece models (the same object when one serves both sides).

    Encoding adds no specials: batching appends ``eos`` to sources and builds the target's
    ``[bos] + y`` / ``y + [eos]`` pair (see ``data/batching.py``).

    Attributes (every implementation sets them):
        special: The special ids.
        src_vocab_size, tgt_vocab_size: Ids per side (the model's embedding rows).
        joint: One vocabulary for source and target.
        tags: Words that start a source text and encode as one id each (our models'
            user-defined symbols, ``<2de>``; an imported model's language tokens, ``>>deu<<``).

    Args:
        src_model: Serialized SentencePiece model proto for the source side (or both sides).
        tgt_model: Serialized target model; None means the source model serves both sides.
    """

    STATE_VERSION: int  # of :meth:`state_dict`; ``load_tokenizer`` accepts each class's

    special: SpecialIds
    src_vocab_size: int
    tgt_vocab_size: int
    joint: bool
    tags: dict[str, int]

    def __init__(self, src_model: bytes, tgt_model: bytes | None) -> None:
        self._src_bytes = bytes(src_model)
        self._tgt_bytes = None if tgt_model is None else bytes(tgt_model)
        self._src = self._load(self._src_bytes, "source SentencePiece model")
        self._tgt = (
            self._src
            if self._tgt_bytes is None
            else self._load(self._tgt_bytes, "target SentencePiece model")
        )

    def _load(self, model: bytes, name: str) -> spm.SentencePieceProcessor:
        """SentencePiece's processor for a serialized model; `name` says which in errors."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model)
        except (RuntimeError, OSError) as e:
            raise DataError(
                f"{name} is not a valid SentencePiece model ({e}); delete it to retrain"
            ) from e
        return processor

    # --- languages (a model without language codes: none; see VocabTokenizer) ---------------

    @property
    def languages(self) -> list[str]:
        """The language codes of a multilingual imported model ([] for any other)."""
        return []

    def for_languages(self, src_lang: str | None, tgt_lang: str | None) -> Tokenizer:
        """This tokenizer for one language pair (None: the one it has, if any): what
        `encode_src` and `target_prefix` then add. Itself when nothing changes.

        Raises:
            DataError: a code the model lacks (the message lists the ones it has), a model
                without language codes given one, or a missing code the model needs.
        """
        if src_lang is not None or tgt_lang is not None:
            raise DataError(
                f"this model has no language codes, so a language pair "
                f"({src_lang or '-'} -> {tgt_lang or '-'}) means nothing to it; drop "
                "--src-lang/--tgt-lang (tokenizer.src_lang/tgt_lang)"
            )
        return self

    def source_prefix(self) -> list[int]:
        """Ids that start every source: a language token (NLLB: the source language's;
        multi-target OPUS-MT: the target language's), or nothing."""
        return []

    def target_prefix(self) -> list[int]:
        """Ids that start every target and are given, not predicted (NLLB's target language
        token): forced by search, left out of the output, scored 0."""
        return []

    # --- text <-> ids -------------------------------------------------------------------------

    @abstractmethod
    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source texts -> ids, without bos/eos; tags that start a text are one id each."""

    @abstractmethod
    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        """Target texts -> ids, without bos/eos (and without `target_prefix`)."""

    @abstractmethod
    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Target ids -> detokenized text; stops at the first eos and drops pad/bos."""

    @abstractmethod
    def decode_src(self, ids: list[list[int]]) -> list[str]:
        """Source ids -> detokenized text (for logging sample inputs)."""

    @abstractmethod
    def src_pieces(self, ids: list[int]) -> list[str]:
        """Source ids -> pieces (attention-plot axis labels); specials shown as ``</s>`` etc."""

    @abstractmethod
    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """Target ids -> pieces (attention-plot axis labels)."""

    # --- persistence --------------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """Hash of the model bytes: names encoded-corpus caches (see ``data/dataset.py``)."""
        return hashlib.sha256(b"".join(self._identity())).hexdigest()[:16]

    def _identity(self) -> list[bytes]:
        """What the ids depend on: the model bytes."""
        return [self._src_bytes, self._tgt_bytes or b"joint"]

    def state_dict(self) -> dict:
        """Plain types only, so it survives ``torch.load(weights_only=True)``."""
        state: dict = {
            "format": STATE_FORMAT,
            "version": self.STATE_VERSION,
            "joint": self.joint,
            "src_model": self._src_bytes,
        }
        if self._tgt_bytes is not None:
            state["tgt_model"] = self._tgt_bytes
        return state

    @classmethod
    @abstractmethod
    def from_state_dict(cls, state: dict) -> Tokenizer:
        """Rebuild this class from its :meth:`state_dict`; a state of either class:
        ``data.tokenizers.load_tokenizer``."""
        raise NotImplementedError

    @abstractmethod
    def save(self, out_dir: str | Path) -> None:
        """Write the tokenizer's files into a run dir."""

    # Pickle through the model bytes: ``datasets.map(num_proc>1)`` sends the tokenizer to
    # worker processes.
    def __getstate__(self) -> dict:
        return self.state_dict()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(type(self).from_state_dict(state).__dict__)
