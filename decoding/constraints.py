"""Terminology on token ids: a glossary's terms (`decoding.glossary`) as lexical constraints of
the beam search.

Legend: B sentences, K beam, N = B * K rows (hypotheses), c candidates per row, C candidates per
sentence, M term variants per sentence, L tokens of the longest variant, G terms per sentence,
W = M + G + 1 state columns, V vocab.

Each term `decoding.glossary.Glossary.find` finds in a sentence becomes one constraint: its
target term, exactly as written, must appear in the translation.

A constraint is a disjunction of token sequences (`term_variants`): SentencePiece may split a
term differently in a sentence than alone (after "(" or a quote its first piece has no word
boundary "▁"; before punctuation its last piece may take the punctuation along), so every
segmentation found in a few contexts is allowed. Where a term may stand (`piece_classes`):
- a variant that starts without "▁" may only start at the output's start or after an opening
  bracket or quote, never right after a letter, a digit or a final mark (. ! ? and their CJK
  forms): a term begins where a word begins;
- a variant just completed may not be followed by a piece that continues its word or joins it
  to the next (a letter, a digit or a hyphen without "▁"): no invented compound;
- the sentence's last final mark waits, as EOS does, until every term is met, so no term
  stands after it: the n-th final mark of the output, n the number of final marks in the
  source (at least 1), cannot come while a term is unmet.

A term replaces the translation the model would give its source term rather than standing
beside it: each term may carry `avoid` sequences (`TermIds`), the usual translation of its
source term (the translator asks the unconstrained model), which no hypothesis of that
sentence may write (`mask_usual`; a compound that starts with that word is blocked too).

The search is dynamic beam allocation (Post & Vilar 2018), vectorised over sentences and
hypotheses as in Hu et al. 2019 (fairseq's `LexicallyConstrainedBeamSearch`):
- each hypothesis carries its state on the search's rows beside the KV cache: per variant, how
  many of its tokens end the hypothesis (`prog`); per term, whether it is met (`met`); how
  many final marks it holds (`marks`); whether a term was completed by its last token
  (`ended`), packed in one (N, W) long tensor;
- each step's candidates are each hypothesis's top 2K tokens plus, per unmet term variant, its
  next token (the first one, or the one that continues a partial match);
- a candidate's bank is the number of constraint tokens it has met (met terms count fully,
  partial matches count their matched tokens); the beam is filled round-robin over the banks,
  fullest bank first: the best candidate of each bank, then the second best of each, ...;
- EOS, and the sentence's last final mark, are only allowed once every term is met (or where
  the output budget forces EOS).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.alignment import WORD_START, word_ids

# Contexts a target term is encoded in to find its segmentations (`term_variants`).
_CONTEXTS = ("{}", "{}.", "{},", "({})", '"{}"')
# A piece ending in one of these may be followed by a term's piece without "▁".
OPENING = "([{\"'„“‚‘«»‹›¿¡（「『【《"
FINAL_MARKS = ".!?。！？"
JOINERS = "-‐‑_"  # a piece starting with one, without "▁", joins the word before it


class TermIds(list):
    """A term's variants (token id lists), and `avoid`: token sequences of the usual
    translation of its source term, which the output of a sentence holding it may not write."""

    def __init__(self, variants: list[list[int]], avoid: list[list[int]] | None = None) -> None:
        super().__init__(variants)
        self.avoid = avoid or []


# ------------------------------------------------------------------------- token sequences


def term_variants(tokenizer: Tokenizer, target: str) -> list[list[int]]:
    """The token sequences that spell `target` as a whole word: in each context of `_CONTEXTS`,
    the shortest windows of the encoded context whose text is the term (plus punctuation that
    shares its last piece); the segmentation of the term alone comes first.

    Only starts whose text onwards begins with the term are tried (`_term_windows`), each
    from its first window as long as the term: a few decodes of the context, however long."""
    variants: list[list[int]] = []
    pattern = re.compile(re.escape(target) + r"[^\w\s]*")
    for context in _CONTEXTS:
        ids = tokenizer.encode_tgt([context.format(target)])[0]
        for i, ends in _term_windows(tokenizer, ids, target):
            for j in ends:
                if pattern.fullmatch(tokenizer.decode_tgt([ids[i:j]])[0].strip()):
                    if ids[i:j] not in variants:
                        variants.append(ids[i:j])
                    break
    return variants or [tokenizer.encode_tgt([target])[0]]


_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _term_windows(tokenizer: Tokenizer, ids: list[int], target: str) -> Iterator[tuple[int, range]]:
    """Per start i of `ids` that may begin `target`, the ends j to try in order; every other
    window's text cannot be the term. Decoding concatenates the pieces' texts (the first
    piece losing its word boundary), so the text of ids[i:j] is a prefix of the text of
    ids[i:k] for k > j, and the text from i onwards gets no longer as i grows. A byte piece
    breaks that (a window may cut a character in two), and so may a term holding U+FFFD:
    then every window is tried."""
    n = len(ids)
    if "\ufffd" in target or any(_BYTE_PIECE.fullmatch(p) for p in tokenizer.tgt_pieces(ids)):
        yield from ((i, range(i + 1, n + 1)) for i in range(n))
        return
    for i in range(n):
        rest = tokenizer.decode_tgt([ids[i:]])[0].lstrip()
        if len(rest) < len(target):
            return  # no later start has text enough either
        if rest.startswith(target):
            lo, hi = i + 1, n  # the first end whose text is as long as the term
            while lo < hi:
                mid = (lo + hi) // 2
                if len(tokenizer.decode_tgt([ids[i:mid]])[0].strip()) >= len(target):
                    hi = mid
                else:
                    lo = mid + 1
            yield i, range(lo, n + 1)


class Pieces(NamedTuple):
    """Classes of the target pieces, (V,) bool each, and of the source pieces."""

    glued: Tensor  # continues or joins the word before it (no "▁"; a word character or joiner)
    opener: Tensor  # BOS, a bare "▁", or ends in an opening bracket or quote
    final: Tensor  # ends in a final mark (. ! ? and their CJK forms)
    src_final: Tensor  # (V_src,) the same for source pieces


def piece_classes(tokenizer: Tokenizer, bos: int) -> Pieces:
    """The classes of `Pieces`: a variant without "▁" may start only after an `opener`, and a
    completed term may not be followed by a `glued` piece."""
    pieces = tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size)))
    glued = torch.tensor(
        [bool(p) and p[0] != "▁" and (p[0].isalnum() or p[0] in JOINERS) for p in pieces]
    )
    opener = torch.tensor([p == "▁" or (bool(p) and p[-1] in OPENING) for p in pieces])
    opener[bos] = True
    final = torch.tensor([bool(p) and p[-1] in FINAL_MARKS for p in pieces])
    src = tokenizer.src_pieces(list(range(tokenizer.src_vocab_size)))
    src_final = torch.tensor([bool(p) and p[-1] in FINAL_MARKS for p in src])
    return Pieces(glued, opener, final, src_final)


def final_marks(src_ids: list[list[int]], src_final: Tensor) -> list[int]:
    """Per source, its final marks (at least 1): the output's mark of that rank ends it."""
    return [max(1, int(src_final[ids].sum())) if ids else 1 for ids in src_ids]


class ConstraintSet(NamedTuple):
    """Each sentence's terms as variants, padded: one row per sentence (or per hypothesis,
    after `rows`). A sentence without terms has no valid variant and one bank."""

    seqs: Tensor  # (B, M, L) long: variant tokens, -1 past each variant's end
    lens: Tensor  # (B, M) long: tokens per variant; 0 = no variant
    attached: Tensor  # (B, M) bool: the variant's first piece is glued (no "▁")
    groups: Tensor  # (B, M, G) float: one-hot, the term each variant spells
    sizes: Tensor  # (B, G) long: tokens of each term's longest variant; 0 = no term
    limits: Tensor  # (B,) long: the rank of the final mark that ends the sentence
    avoid_head: Tensor  # (B, A, P) long: avoided sequences but their last token,
    #   right-aligned, -1 = any token (left of a shorter sequence)
    avoid_last: Tensor  # (B, A) long: their last token; -1 = none
    glued: Tensor  # (V,) bool (`piece_classes`)
    opener: Tensor  # (V,) bool
    final: Tensor  # (V,) bool
    n_banks: int  # 1 + most constraint tokens of a sentence

    def select(self, sentences: Tensor) -> ConstraintSet:
        """Keep the live sentences (B',) only."""
        fields = (f.index_select(0, sentences) for f in self[:_PER_SENTENCE])
        return ConstraintSet(*fields, *self[_PER_SENTENCE:])

    def rows(self, n_rows: int) -> ConstraintSet:
        """One row per hypothesis (K consecutive rows per sentence)."""
        k = n_rows // self.seqs.size(0)
        fields = (f.repeat_interleave(k, dim=0) if k > 1 else f for f in self[:_PER_SENTENCE])
        return ConstraintSet(*fields, *self[_PER_SENTENCE:])

    def width(self) -> int:
        """W: state columns per hypothesis."""
        return self.seqs.size(1) + self.sizes.size(1) + 2


_PER_SENTENCE = 8  # the fields of `ConstraintSet` with one row per sentence


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i : i + n] == part for i in range(len(seq) - n + 1))


def _avoided(terms: list[list[list[int]]]) -> list[list[int]]:
    """A sentence's avoided sequences, but none that a variant of its terms holds (a term
    is never blocked)."""
    variants = [v for t in terms for v in t]
    found: list[list[int]] = []
    for term in terms:
        for seq in getattr(term, "avoid", []):
            if seq and seq not in found and not any(_contains(v, seq) for v in variants):
                found.append(seq)
    return found


def constraint_set(
    terms: list[list[list[list[int]]]],
    glued: Tensor,
    opener: Tensor,
    device: torch.device,
    final: Tensor | None = None,
    limits: list[int] | None = None,
) -> ConstraintSet:
    """Per sentence, per term, its variants (token id lists, or `TermIds` with the sequences
    to avoid) -> padded tensors on `device`. `final`: the final-mark pieces (None: none);
    `limits`: per sentence, the rank of the final mark that ends it (None: 1)."""
    G = max(1, max(len(t) for t in terms))
    M = max(1, max(sum(len(v) for v in t) for t in terms))
    L = max([1] + [len(s) for t in terms for v in t for s in v])
    avoided = [_avoided(t) for t in terms]
    A = max([1] + [len(a) for a in avoided])
    P = max([1] + [len(s) - 1 for a in avoided for s in a])
    B = len(terms)
    seqs = torch.full((B, M, L), -1, dtype=torch.long)
    lens = torch.zeros(B, M, dtype=torch.long)
    groups = torch.zeros(B, M, G)
    sizes = torch.zeros(B, G, dtype=torch.long)
    attached = torch.zeros(B, M, dtype=torch.bool)
    head = torch.full((B, A, P), -1, dtype=torch.long)
    last = torch.full((B, A), -1, dtype=torch.long)
    for b, sentence in enumerate(terms):
        m = 0
        for g, variants in enumerate(sentence):
            sizes[b, g] = max(len(v) for v in variants)
            for v in variants:
                seqs[b, m, : len(v)] = torch.tensor(v)
                lens[b, m], groups[b, m, g], attached[b, m] = len(v), 1.0, bool(glued[v[0]])
                m += 1
        for a, seq in enumerate(avoided[b]):
            last[b, a] = seq[-1]
            if len(seq) > 1:
                head[b, a, P - len(seq) + 1 :] = torch.tensor(seq[:-1])
    n_banks = 1 + int(sizes.sum(dim=1).max())
    limit = torch.tensor(limits if limits is not None else [1] * B, dtype=torch.long)
    final = torch.zeros_like(glued) if final is None else final
    fields = (seqs, lens, attached, groups, sizes, limit, head, last, glued, opener, final)
    return ConstraintSet(*(f.to(device) for f in fields), n_banks)


# ------------------------------------------------------------------------- per-hypothesis state


class State(NamedTuple):
    prog: Tensor  # (..., M) long: tokens of each variant that end the hypothesis
    met: Tensor  # (..., G) bool: terms met
    marks: Tensor  # (...) long: final marks written
    ended: Tensor  # (...) bool: the last token completed a term


def initial_state(cons: ConstraintSet) -> Tensor:
    """(B, W) long: nothing met, nothing matched."""
    return torch.zeros(cons.seqs.size(0), cons.width(), dtype=torch.long, device=cons.seqs.device)


def unpack(cons: ConstraintSet, packed: Tensor) -> State:
    M, G = cons.seqs.size(1), cons.sizes.size(1)
    met = packed[..., M : M + G].bool()
    return State(packed[..., :M], met, packed[..., -2], packed[..., -1].bool())


def pack(state: State) -> Tensor:
    tail = [state.marks.unsqueeze(-1), state.ended.long().unsqueeze(-1)]
    return torch.cat([state.prog, state.met.long(), *tail], dim=-1)


def unmet(cons: ConstraintSet, packed: Tensor) -> Tensor:
    """(N,) bool: rows with a term still to meet (rows of `cons.rows`)."""
    return (cons.sizes.gt(0) & ~unpack(cons, packed).met).any(dim=1)


def mask_glued(cons: ConstraintSet, packed: Tensor, lprobs: Tensor) -> Tensor:
    """Rows whose last token completed a term may not continue its word (in place: only
    those few rows are touched, not all N x V).

    Shape: lprobs (N, V) -> (N, V)."""
    rows = unpack(cons, packed).ended.nonzero().squeeze(1)  # (R,)
    masked = lprobs.index_select(0, rows).masked_fill_(cons.glued.unsqueeze(0), float("-inf"))
    return lprobs.index_copy_(0, rows, masked)


def mask_final(cons: ConstraintSet, packed: Tensor, lprobs: Tensor) -> Tensor:
    """Rows with a term unmet may not write the final mark that ends their sentence (in
    place).

    Shape: lprobs (N, V) -> (N, V)."""
    state = unpack(cons, packed)
    rows = (unmet(cons, packed) & state.marks.add(1).ge(cons.limits)).nonzero().squeeze(1)
    masked = lprobs.index_select(0, rows).masked_fill_(cons.final.unsqueeze(0), float("-inf"))
    return lprobs.index_copy_(0, rows, masked)


def mask_usual(cons: ConstraintSet, tokens: Tensor, lprobs: Tensor) -> Tensor:
    """No row writes an avoided sequence of its sentence: where a row's last tokens are one's
    head, its last token is -inf (in place).

    Shape: tokens (N, t) the tokens so far, lprobs (N, V) -> (N, V)."""
    N, P = tokens.size(0), cons.avoid_head.size(2)
    tail = tokens[:, -P:]  # (N, <= P)
    if tail.size(1) < P:
        tail = torch.cat([tail.new_full((N, P - tail.size(1)), -2), tail], dim=1)
    head = cons.avoid_head  # (N, A, P)
    match = (head.lt(0) | head.eq(tail.unsqueeze(1))).all(dim=2) & cons.avoid_last.ge(0)
    rows, cols = match.nonzero(as_tuple=True)
    lprobs[rows, cons.avoid_last[rows, cols]] = float("-inf")
    return lprobs


def _next_expected(cons: ConstraintSet, prog: Tensor) -> Tensor:
    """(N, M): each variant's token after its matched part (-1 where none is left)."""
    L = cons.seqs.size(2)
    return cons.seqs.gather(2, prog.clamp(max=L - 1).unsqueeze(2)).squeeze(2)


def extra_candidates(
    cons: ConstraintSet, packed: Tensor, lprobs: Tensor, top: Tensor, last: Tensor
) -> tuple[Tensor, Tensor]:
    """Per row, the next token of every variant of an unmet term, with its log-probability;
    -inf where the variant is padding, its term met, the token already among the row's `top`
    tokens or an earlier valid variant's, or an attached variant would start after a word.

    Shape: lprobs (N, V), top (N, n), last (N,) -> (N, M) float, (N, M) long.
    """
    state = unpack(cons, packed)
    nxt = _next_expected(cons, state.prog)  # (N, M)
    term_met = (cons.groups * state.met.unsqueeze(1)).sum(dim=2).gt(0)  # (N, M)
    ok = cons.lens.gt(0) & ~term_met & nxt.ge(0)
    starting = state.prog.eq(0)
    ok &= ~(starting & cons.attached & ~cons.opener[last].unsqueeze(1))
    ok &= ~nxt.unsqueeze(2).eq(top.unsqueeze(1)).any(dim=2)  # proposed already
    M = nxt.size(1)
    earlier = torch.ones(M, M, dtype=torch.bool, device=nxt.device).tril(-1)  # (M, M)
    # a token another variant proposes already; only a proposing one counts (a met term's
    # variant proposes nothing, so it hides no token of an unmet one)
    same = nxt.unsqueeze(2).eq(nxt.unsqueeze(1)) & earlier & ok.unsqueeze(1)  # (N, M, M)
    ok &= ~same.any(dim=2)
    token = nxt.clamp(min=0)
    return lprobs.gather(1, token).masked_fill(~ok, float("-inf")), token


def advance(
    cons: ConstraintSet, packed: Tensor, tokens: Tensor, last: Tensor
) -> tuple[Tensor, Tensor]:
    """The state after each candidate token, and its bank (constraint tokens met).

    A variant's match goes on where the token is its next one, restarts at 1 where the token is
    its first (an attached variant only after an opener), else drops to 0 (Post & Vilar's
    unwinding). A term is met once any variant is complete; met terms count all their tokens
    in the bank, unmet ones their longest partial match.

    Shape: packed (N, W), tokens (N, c), last (N,) -> (N, c, W) long, (N, c) long.
    """
    state = unpack(cons, packed)
    t = tokens.unsqueeze(2)  # (N, c, 1)
    first = cons.seqs[:, :, 0].unsqueeze(1)  # (N, 1, M)
    may_start = (~cons.attached | cons.opener[last].unsqueeze(1)).unsqueeze(1)  # (N, 1, M)
    started = state.prog.gt(0).unsqueeze(1)  # (N, 1, M)
    going_on = _next_expected(cons, state.prog).unsqueeze(1).eq(t) & started  # (N, c, M)
    prog = torch.where(going_on, state.prog.unsqueeze(1) + 1, (first.eq(t) & may_start).long())
    complete = prog.ge(cons.lens.unsqueeze(1)) & cons.lens.gt(0).unsqueeze(1)  # (N, c, M)
    now_met = torch.bmm(complete.float(), cons.groups).gt(0)  # (N, c, G)
    met = state.met.unsqueeze(1) | now_met
    prog = prog.masked_fill(torch.bmm(met.float(), cons.groups.transpose(1, 2)).gt(0), 0)
    sizes = cons.sizes.unsqueeze(1)  # (N, 1, G)
    partial = (prog.unsqueeze(3) * cons.groups.unsqueeze(1)).amax(dim=2)  # (N, c, G)
    partial = torch.minimum(partial.long(), (sizes - 1).clamp(min=0))
    bank = torch.where(met, sizes, partial).sum(dim=2)  # (N, c)
    ended = (now_met & ~state.met.unsqueeze(1)).any(dim=2)  # (N, c)
    marks = state.marks.unsqueeze(1) + cons.final[tokens].long()  # (N, c)
    return pack(State(prog, met, marks, ended)), bank


def allocate(scores: Tensor, banks: Tensor, n_keep: int, n_banks: int) -> Tensor:
    """Candidates in the order the beam takes them: round-robin over banks, fullest bank first
    (the best of each bank, then the second best of each, ...); -inf candidates last.

    Shape: scores, banks (B, C) -> (B, n_keep) indices into C.
    """
    by_score = scores.argsort(dim=1, descending=True)  # (B, C)
    bank = banks.gather(1, by_score)
    onehot = F.one_hot(bank, n_banks)  # (B, C, n_banks)
    rank = (onehot.cumsum(dim=1) * onehot).sum(dim=2) - 1  # (B, C) rank within its bank
    key = rank * n_banks + (n_banks - 1 - bank)
    key = key.masked_fill(scores.gather(1, by_score).isneginf(), scores.size(1) * n_banks)
    order = key.topk(min(n_keep, key.size(1)), dim=1, largest=False).indices  # keys unique
    return by_score.gather(1, order)


# ------------------------------------------------------------------------- usual translations


def _word_texts(pieces: list[str]) -> list[str]:
    """The words of a piece sequence (`decoding.alignment.word_ids`), as text."""
    words: list[str] = []
    for piece, index in zip(pieces, word_ids(pieces), strict=True):
        if index == len(words):
            words.append("")
        words[index] += piece.replace(WORD_START, "")
    return words


def _bare(word: str) -> str:
    return re.sub(r"^[^\w]+|[^\w]+$", "", word)


def salient_words(
    tgt_pieces: list[str], with_term: list[float], without_term: list[float], drop: float
) -> set[str]:
    """The word of a translation (punctuation stripped) whose log-probability falls most once
    the source term is deleted from the source, if it falls by at least `drop`: the term's
    translation (one word: the words that only agree with it, such as its article, fall less).

    `with_term`, `without_term`: the log-probability of each piece of the translation under
    the source with and without the term (teacher-forced)."""
    words = _word_texts(tgt_pieces)
    fall = [0.0] * len(words)
    for index, a, b in zip(word_ids(tgt_pieces), with_term, without_term, strict=False):
        fall[index] += a - b
    if not words or max(fall) < drop:
        return set()
    return {_bare(words[fall.index(max(fall))])} - {""}


def usual_words(found: list[set[str]]) -> list[str]:
    """The words found in at least half of the sentences sampled (and longer than one
    character): a source term's usual translation."""
    counts: dict[str, int] = {}
    for words in found:
        for w in words:
            counts[w] = counts.get(w, 0) + 1
    return sorted(w for w, n in counts.items() if 2 * n >= len(found) and len(w) > 1)
