"""`constraints.term_variants`: the same variants as the all-windows search it replaces, found
with a number of decodes that grows linearly with the term's length."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sentencepiece as spm

from attnmt.data.spm_tokenizer import SpmTokenizer
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding import constraints as lexical
from tests.helpers_decoding import PAIRS

TERMS = [
    "Hund", "Mann", "Fahrrad", "Kaffee", "a", "A", "Eine Frau", "New York City",
    "spielen im Park", "Fußball", "Mädchen", "läuft", "Zwei Männer spielen Fußball",
    "e-mail", "U.S.A.", "(Hund)", "Hund,", "Dr. Müller", "C++", "50%", "rock'n'roll",
    "Ärger", "Öl", "über", "东京", "北京大学", "日本語のテキスト", "Ωμέγα", "☃☃",
    "ℵ", "Hund Hund Hund", "aaaaaaaaaaaaaaaa", "ha ha ha ha", "Mann-Mann",
    "Ein Mann fährt Fahrrad. " * 8, "Straßenbahnhaltestelle" * 6, "x" * 200,
    "", " Hund", "Hund  Katze", "a\tb", "⁇", "\ufffd", "Hund\ufffd", ".", "...",
    "Die Frau singt ein Lied, das Kind isst einen Apfel (und) \"Zwei Hunde\".",
]  # fmt: skip


def all_windows_variants(tokenizer: Tokenizer, target: str) -> list[list[int]]:
    """The former search: every window ids[i:j] of each encoded context, decoded."""
    variants: list[list[int]] = []
    pattern = re.compile(re.escape(target) + r"[^\w\s]*")
    for context in lexical._CONTEXTS:
        ids = tokenizer.encode_tgt([context.format(target)])[0]
        for i in range(len(ids)):
            for j in range(i + 1, len(ids) + 1):
                if pattern.fullmatch(tokenizer.decode_tgt([ids[i:j]])[0].strip()):
                    if ids[i:j] not in variants:
                        variants.append(ids[i:j])
                    break
    return variants or [tokenizer.encode_tgt([target])[0]]


class CountingTokenizer:
    """Passes calls to a tokenizer, counting the sequences `decode_tgt` decodes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.decoded = 0

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        self.decoded += len(ids)
        return self._tokenizer.decode_tgt(ids)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._tokenizer, name)


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A SentencePiece model with byte fallback: characters it lacks become byte pieces."""
    prefix = tmp_path_factory.mktemp("spm_bytes") / "m"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in PAIRS for text in pair]), model_prefix=str(prefix),
        vocab_size=400, byte_fallback=True, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return SpmTokenizer(Path(f"{prefix}.model").read_bytes())


@pytest.mark.parametrize("term", TERMS)
def test_variants_equal_the_all_windows_search(tokenizer: Tokenizer, term: str) -> None:
    assert lexical.term_variants(tokenizer, term) == all_windows_variants(tokenizer, term)


@pytest.mark.parametrize("term", ["Hund", "东京", "Fußball (东)", "Ωμέγα", "日本語" * 5])
def test_variants_equal_the_all_windows_search_with_byte_pieces(
    byte_tokenizer: Tokenizer, term: str
) -> None:
    pieces = byte_tokenizer.tgt_pieces(byte_tokenizer.encode_tgt([term])[0])
    assert term == "Hund" or any(p.startswith("<0x") for p in pieces)
    assert lexical.term_variants(byte_tokenizer, term) == all_windows_variants(byte_tokenizer, term)


def test_decodes_grow_linearly_with_the_term(tokenizer: Tokenizer) -> None:
    counts = []
    for size in (50, 500):
        counting = CountingTokenizer(tokenizer)
        term = ("Zwei Hunde spielen im Park, " * 40)[:size].strip(" ,")
        assert lexical.term_variants(counting, term) == lexical.term_variants(tokenizer, term)
        counts.append(counting.decoded)
    assert counts[1] <= 15 * counts[0], counts
