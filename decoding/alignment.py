"""Word alignment from cross-attention (fairseq's `--print-alignment`, Marian's `--alignment`).

For each target word, the source word it attends to most: the cross-attention of one decoder
layer, averaged over its heads, is summed over each source word's subwords and averaged over
each target word's subwords, and each target word is aligned to its argmax source word (a
hard alignment, as fairseq's `extract_hard_alignment` does per subword). Words are the
whitespace-separated words of the text: a SentencePiece piece starting with "▁" starts a word.
EOS is left out on both sides.

The default layer is the penultimate decoder layer: Garg et al. (2019, "Jointly Learning to
Align and Translate with Transformer Models") found its attention aligns better than the
last layer's, and fairseq's alignment model supervises that layer (`--alignment-layer 4` of
6). Any layer can be chosen (`translate.py --alignment-layer`).
"""

from __future__ import annotations

import torch
from torch import Tensor

Alignment = list[tuple[int, int]]  # (source word, target word) pairs, 0-based, target order

WORD_START = "\u2581"  # SentencePiece's "▁"


def word_ids(pieces: list[str]) -> list[int]:
    """The 0-based word index of each piece: a new word at each piece that starts with "▁"."""
    ids, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        ids.append(word)
    return ids


def word_alignment(cross: Tensor, src_pieces: list[str], tgt_pieces: list[str]) -> Alignment:
    """Hard word alignment from one sentence's attention weights.

    Shape: cross (T + 1, S + 1): row t is the step that produced target piece t (the last row
    produced EOS), column s source piece s (the last column is the source EOS); both EOS are
    dropped.
    """
    if not src_pieces or not tgt_pieces:
        return []
    weights = cross[: len(tgt_pieces), : len(src_pieces)].float()  # (T, S)
    src_words = torch.tensor(word_ids(src_pieces))  # (S,)
    tgt_words = torch.tensor(word_ids(tgt_pieces))  # (T,)
    n_src, n_tgt = int(src_words[-1]) + 1, int(tgt_words[-1]) + 1
    per_src_word = torch.zeros(len(tgt_pieces), n_src).index_add_(1, src_words, weights)  # (T, W_s)
    per_pair = torch.zeros(n_tgt, n_src).index_add_(0, tgt_words, per_src_word)  # (W_t, W_s)
    best = per_pair.argmax(dim=1).tolist()  # averaging over a word's pieces keeps the argmax
    return [(i, j) for j, i in enumerate(best)]


def format_alignment(alignment: Alignment) -> str:
    """Pharaoh format, as fairseq and Marian print it: "i-j" pairs (source-target), spaces."""
    return " ".join(f"{i}-{j}" for i, j in alignment)
