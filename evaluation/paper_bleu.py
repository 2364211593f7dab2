"""The BLEU of the Transformer paper's WMT14 en-de table (27.3 base, 28.4 big): tokenized,
compound-split, case-sensitive corpus BLEU, as tensor2tensor's `get_ende_bleu.sh` and fairseq's
`compound_split_bleu.sh` compute it, next to which sacreBLEU's number is not comparable.

Their pipeline: Moses' `tokenizer.perl -l de` on hypotheses and references, every hyphen
between two non-spaces split out as its own token (`rich-text` -> `rich ##AT##-##AT## text`,
the "compound splitting" GNMT and ConvS2S reported with), then `multi-bleu.perl`: BLEU over
whitespace tokens, no smoothing, one reference.

Here, with what sacreBLEU ships (no Perl, no Moses):

1. tokenization: sacreBLEU's `intl` tokenizer (mteval-v14's international rules) stands in for
   Moses' tokenizer. Like Moses it splits off every punctuation mark and symbol, German
   quotes and apostrophes included. Unlike Moses it keeps no abbreviation's period
   (`Dr.` -> `Dr .`; Moses keeps those of its German non-breaking prefix list and of words
   with an inner period like `z.B.`), keeps a period after a number at the very end of a line
   (`2014.`; Moses splits it), splits a hyphen between letters itself (`rich - text`: the
   same tokens, up to the hyphen's spelling, as step 2 makes of Moses' `rich-text`), and
   writes no `&quot;`-style escapes (Moses does, on both sides alike: no effect on matches);
2. compound splitting: the same substitution as the Perl one-liner, `(\\S)-(\\S)` ->
   `\\1 ##AT##-##AT## \\2`, non-overlapping (`a-b-c` -> `a ##AT##-##AT## b-c`, as in Perl);
3. BLEU: sacreBLEU with `tokenize="none"`, `smooth_method="none"`: multi-bleu.perl's formula
   (geometric mean of 1-4-gram precisions, brevity penalty, 0 when a precision is 0).
"""

from __future__ import annotations

import re

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

from attnmt.evaluation.bleu import Score, check_lengths

_COMPOUND = re.compile(r"(\S)-(\S)")
_tokenize = TokenizerV14International()
# How this number was made, printed with it (sacreBLEU's signature style).
SIGNATURE = "tok:intl+compound-split(##AT##-##AT##)|case:mixed|smooth:none|bleu:multi-bleu.perl"


def paper_tokens(line: str) -> str:
    """One line tokenized and compound-split as the paper's BLEU sees it."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", _tokenize(line.strip()))


def paper_bleu(hyps: list[str], refs: list[str]) -> Score:
    """Tokenized, compound-split corpus BLEU of raw (detokenized) hypotheses against raw
    references, as the paper's table reports it (see the module docstring)."""
    check_lengths(hyps, refs)
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    result = metric.corpus_score([paper_tokens(h) for h in hyps], [[paper_tokens(r) for r in refs]])
    return Score(result.score, SIGNATURE)
