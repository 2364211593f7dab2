"""Our own SentencePiece tokenizer: the ids are SentencePiece's.

One model is shared by source and target by default (``joint``), as in the Transformer paper's
shared BPE vocabulary (Vaswani et al. 2017, sec. 5.1); separate models are an option. The
special ids are set explicitly when training (``data/spm_train.py``) because SentencePiece's
defaults (unk 0, bos 1, eos 2, no pad) differ from the ones the model code assumes (pad 0,
unk 1, bos 2, eos 3).

A run dir holds ``spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model`` (separate), plus
the matching human-readable ``.vocab`` files.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import sentencepiece as spm

from attnmt.common.files import atomic_write
from attnmt.data.errors import DataError
from attnmt.data.tokenizer import SpecialIds, Tokenizer, check_texts

JOINT_MODEL = "spm.model"
SRC_MODEL = "spm.src.model"
TGT_MODEL = "spm.tgt.model"


class SpmTokenizer(Tokenizer):
    """Source and target SentencePiece models of ours (the same object when ``joint``); the
    special ids and the tags (user-defined symbols) are the source model's.

    Args:
        src_model: Serialized SentencePiece model proto for the source side (or both sides).
        tgt_model: Serialized target model; None means one joint model.
    """

    STATE_VERSION = 1

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None) -> None:
        self.joint = tgt_model is None
        super().__init__(src_model, tgt_model)
        self.special = _special_of(self._src)
        if _special_of(self._tgt) != self.special:
            raise DataError(
                f"source and target SentencePiece models disagree on special ids "
                f"({self.special} vs {_special_of(self._tgt)}); retrain them together"
            )
        self.src_vocab_size = self._src.get_piece_size()
        self.tgt_vocab_size = self._tgt.get_piece_size()
        # Tags (user-defined symbols of the source model) -> their ids.
        self.tags = {tag: self._src.piece_to_id(tag) for tag in _user_symbols(self._src_bytes)}

    def _load(self, model: bytes, name: str) -> spm.SentencePieceProcessor:
        processor = super()._load(model, name)
        if min(asdict(_special_of(processor)).values()) < 0:
            # A model trained elsewhere without a pad piece cannot pad batches.
            raise DataError(
                f"{name} lacks one of pad/unk/bos/eos (ids {_special_of(processor)}); "
                "retrain it with train_or_load_tokenizer"
            )
        return processor

    # --- text <-> ids -------------------------------------------------------------------------

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        """Source texts -> ids, without bos/eos.

        Tags (``<2de> A man ...``: user-defined symbols, see :attr:`tags`) at the start of a
        text, each followed by a space, become one id each, and the rest is encoded as if it
        stood alone; SentencePiece itself would add a ``▁`` piece before the tag and change
        the first word's pieces."""
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
        return _encode(self._tgt, texts)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return _decode(self._tgt, [self._strip_specials(seq) for seq in ids])

    def decode_src(self, ids: list[list[int]]) -> list[str]:
        return _decode(self._src, [self._strip_specials(seq) for seq in ids])

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
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    # --- persistence --------------------------------------------------------------------------

    @classmethod
    def from_state_dict(cls, state: dict) -> SpmTokenizer:
        return cls(state["src_model"], None if state["joint"] else state.get("tgt_model"))

    def save(self, out_dir: str | Path) -> None:
        """Write ``spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model``, with vocabs."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if self._tgt_bytes is None:
            _write_model(out_dir / JOINT_MODEL, self._src_bytes, self._src)
        else:
            _write_model(out_dir / SRC_MODEL, self._src_bytes, self._src)
            _write_model(out_dir / TGT_MODEL, self._tgt_bytes, self._tgt)


def _special_of(processor: spm.SentencePieceProcessor) -> SpecialIds:
    return SpecialIds(
        processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()
    )


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


# SentencePiece's list calls start a thread pool each time (0.1-0.5 ms, many times a short
# sentence's own cost: the server tokenizes every request): up to this many texts go one call
# each, with the same results.
FEW_TEXTS = 64


def _encode(processor: spm.SentencePieceProcessor, texts: list[str]) -> list[list[int]]:
    check_texts(texts)
    if len(texts) <= FEW_TEXTS:
        return [processor.encode(text, out_type=int) for text in texts]
    return processor.encode(list(texts), out_type=int)


def _decode(processor: spm.SentencePieceProcessor, seqs: list[list[int]]) -> list[str]:
    if len(seqs) <= FEW_TEXTS:
        return [processor.decode(seq) for seq in seqs]
    return processor.decode(seqs)


def _write_model(path: Path, model: bytes, processor: spm.SentencePieceProcessor) -> None:
    """Atomic write (temp file + rename) so a killed run never leaves half a model behind."""
    atomic_write(path, model)
    vocab = "".join(
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
        for i in range(processor.get_piece_size())
    )
    atomic_write(path.with_suffix(".vocab"), vocab.encode("utf-8"))
