"""An imported model's tokenizer (``scripts/import_hf.py``: OPUS-MT, NLLB): SentencePiece
segments, the model's own vocabulary numbers the pieces.

A :class:`Vocabulary` maps SentencePiece's pieces to the model's ids (Marian's ``vocab.json``,
NLLB's fairseq offset) and says where its language tokens go
(:meth:`VocabTokenizer.for_languages`). A run dir holds the tokenizer's state as
``tokenizer.pt``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import sentencepiece as spm

from attnmt.common.files import atomic_write
from attnmt.data.errors import DataError
from attnmt.data.languages import resolve
from attnmt.data.tokenizer import SpecialIds, Tokenizer, check_texts

IMPORTED_TOKENIZER = "tokenizer.pt"  # an imported model's tokenizer state (scripts/import_hf.py)
NLLB_SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # NllbTokenizer's special tokens


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


class VocabTokenizer(Tokenizer):
    """An imported model's tokenizer: SentencePiece's pieces looked up in `vocab` (as
    Transformers' Marian and NLLB tokenizers do).

    Args:
        src_model: Serialized SentencePiece model proto for the source side (or both sides).
        tgt_model: Serialized target model; None means the source model segments both sides.
        vocab: The model's ids; one shared id list makes the tokenizer ``joint``.
    """

    STATE_VERSION = 2  # with a Vocabulary: code that ignored it would give wrong ids

    def __init__(self, src_model: bytes, tgt_model: bytes | None, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.joint = vocab.tgt is vocab.src
        # The special ids come from the vocabulary, so the SentencePiece models may lack them.
        super().__init__(src_model, tgt_model)
        self.special = vocab.special
        self.src_vocab_size, self.tgt_vocab_size = len(vocab.src), len(vocab.tgt)
        self._src_ids = {piece: i for i, piece in enumerate(vocab.src)}
        self._tgt_ids = self._src_ids if self.joint else {p: i for i, p in enumerate(vocab.tgt)}
        # Language tokens in the text (`>>deu<< A man ...`) are one id each, as tags are.
        self.tags = {vocab.src[i]: i for i in vocab.languages.values() if i < len(vocab.src)}
        # Never text, as Transformers' decode(skip_special_tokens=True) skips them: the
        # specials, and NLLB's other special tokens and language tokens (OPUS-MT's `>>deu<<`
        # are ordinary tokens there, printed).
        self._hidden = set(vars(self.special).values())
        if vocab.convention == "nllb":
            named = {i for i, piece in enumerate(vocab.tgt) if piece in NLLB_SPECIAL}
            self._hidden |= named | set(vocab.languages.values())

    # --- languages of a multilingual model ----------------------------------------------------

    @property
    def languages(self) -> list[str]:
        return sorted(self.vocab.languages)

    def for_languages(self, src_lang: str | None, tgt_lang: str | None) -> Tokenizer:
        vocab = self.vocab
        if not vocab.languages:
            return super().for_languages(src_lang, tgt_lang)
        # Any form of a code (ISO 639-1/3, BCP-47, `>>deu<<`) stands for the model's own.
        codes = list(vocab.languages)
        src_lang = vocab.src_lang if src_lang is None else resolve(src_lang, codes) or src_lang
        tgt_lang = vocab.tgt_lang if tgt_lang is None else resolve(tgt_lang, codes) or tgt_lang
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
        return type(self)(self._src_bytes, self._tgt_bytes, bound)

    def source_prefix(self) -> list[int]:
        vocab = self.vocab
        if not vocab.languages:
            return []
        code = vocab.src_lang if vocab.convention == "nllb" else vocab.tgt_lang
        return [] if code is None else [vocab.languages[code]]

    def target_prefix(self) -> list[int]:
        vocab = self.vocab
        if vocab.convention != "nllb" or vocab.tgt_lang is None:
            return []
        return [vocab.languages[vocab.tgt_lang]]

    # --- text <-> ids -------------------------------------------------------------------------

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source texts -> ids, without bos/eos: `source_prefix`, then language tokens that
        start a text (``>>deu<<``, one id each), then the text's pieces."""
        prefix = self.source_prefix()
        return [prefix + ids for ids in self._encode_pieces(texts, source=True)]

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        return self._encode_pieces(texts, source=False)

    def _encode_pieces(self, texts: list[str], source: bool) -> list[list[int]]:
        """SentencePiece's pieces looked up in the vocabulary; language tokens that start a
        source text are one id each."""
        check_texts(texts)
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
        # Transformers' MarianTokenizer decodes a shared vocabulary with the source model.
        return self._decode_pieces(ids, self.vocab.tgt, self._src if self.joint else self._tgt)

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        return self._decode_pieces(ids, self.vocab.src, self._src)

    def _decode_pieces(
        self, ids: list[list[int]], pieces: list[str], processor: spm.SentencePieceProcessor
    ) -> list[str]:
        """Ids -> text as Transformers' tokenizer of the model decodes them with
        `skip_special_tokens=True`, up to the first EOS; ids no piece has (NLLB's spare rows)
        are dropped. Every piece of the vocabulary becomes text, also one the
        SentencePiece model lacks (an OPUS-MT vocab.json holds the pieces of both sides' models):
        its word boundaries (`▁`) become spaces, never a literal `▁`."""
        texts = []
        for seq in ids:
            kept = []
            for token in seq:
                token = int(token)
                if token == self.special.eos:
                    break
                if token not in self._hidden and token < len(pieces) and pieces[token]:
                    kept.append(pieces[token])
            if self.vocab.convention == "nllb":
                texts.append(_metaspace_decode(kept))
            else:  # MarianTokenizer.convert_tokens_to_string
                texts.append(processor.decode_pieces(kept).replace(SPACE, " ").strip())
        return texts

    def src_pieces(self, ids: list[int]) -> list[str]:
        return [_piece(self.vocab.src, i) for i in ids]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [_piece(self.vocab.tgt, i) for i in ids]

    # --- persistence --------------------------------------------------------------------------

    def _identity(self) -> list[bytes]:
        # the ids and the languages change the encoded corpus
        return [*super()._identity(), repr(self.vocab.state_dict()).encode()]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "vocab": self.vocab.state_dict()}

    @classmethod
    def from_state_dict(cls, state: dict) -> VocabTokenizer:
        vocab = Vocabulary.from_state_dict(state["vocab"])
        return cls(state["src_model"], state.get("tgt_model"), vocab)

    def save(self, out_dir: str | Path) -> None:
        """Write ``tokenizer.pt`` (the state: bytes and lists, a safe torch.save /
        weights_only load)."""
        import torch

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / IMPORTED_TOKENIZER, lambda f: torch.save(self.state_dict(), f))


SPACE = "\u2581"  # "▁", SentencePiece's word boundary


def _metaspace_decode(pieces: list[str]) -> str:
    """NLLB's Transformers tokenizer (the `tokenizers` Metaspace decoder, prepend_scheme
    "always"): every `▁` becomes a space, except in the first piece, which loses them all."""
    return "".join(piece.replace(SPACE, "" if i == 0 else " ") for i, piece in enumerate(pieces))


def _piece(pieces: list[str], i: int) -> str:
    i = int(i)
    return pieces[i] if 0 <= i < len(pieces) else f"<{i}>"


def _codes(languages: dict[str, int]) -> str:
    codes = sorted(languages)
    shown = ", ".join(codes[:30])
    return f"{len(codes)} codes: {shown}" + (", ..." if len(codes) > 30 else "")
