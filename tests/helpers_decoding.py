"""Test doubles for decoding tests: a scripted model, a cache-free wrapper, the search settings of
the tiny Transformer, a tiny tokenizer.

Legend: B batch, N rows (B * beams), S src len, t prefix len, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from torch import Tensor

from attnmt.data.spm_train import TokenizerConfig, train_or_load_tokenizer
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.uncached import PrefixCache, UncachedModel  # noqa: F401  (re-exported for tests)
from attnmt.engine import Engine
from attnmt.engine.cache import StepKVCache


@dataclass(frozen=True)
class Special:
    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3


SPECIAL = Special()


class StepEngine(Engine):
    """Every search on the engine's one-token step (`Engine.step`), on the model's float
    layers: what continuous batching and int8 run, for any search."""

    def decode(self, tgt_ids, memory, src_mask, caches=None, offset=0):  # noqa: ANN001, ANN201
        if caches is None:
            return self.model.decode(tgt_ids, memory, src_mask)
        return self.step(tgt_ids, memory, src_mask, caches, offset)

    def new_caches(self) -> list[StepKVCache]:
        return [StepKVCache() for _ in self.decoder_linears]


@contextmanager
def single_thread() -> Iterator[None]:
    """Tiny ops are overhead-bound: extra threads only spin (and crawl on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class ScriptedModel:
    """A fake encoder-decoder whose next-token distribution is a table lookup.

    `script[(sentence, prefix)]` (or `script[prefix]` for every sentence) maps a prefix of
    generated tokens (a tuple, without bos) to `{token: probability}`; the remaining mass is
    spread evenly over the other tokens (tiny, so hand-computed scores stay exact to ~1e-6).
    Unlisted prefixes use `default`. The sentence is the first source id. Also records the rows
    and offset of every decode call.
    """

    vocab_size: int
    script: dict
    default: dict = field(default_factory=dict)  # for prefixes the script does not list
    rows_per_step: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return src_ids.float().unsqueeze(-1)  # (B, S, 1): the rows remember their sentence

    def new_caches(self) -> list[PrefixCache]:
        return [PrefixCache()]

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor, caches: list, offset: int = 0
    ) -> Tensor:
        assert tgt_ids.size(1) == 1, "search must feed one new token per step"
        self.rows_per_step.append(tgt_ids.size(0))
        self.offsets.append(offset)
        prefixes = caches[0].append(tgt_ids)  # (N, t + 1), starts with bos
        rows_per_sentence = tgt_ids.size(0) // memory.size(0)  # memory: one row per sentence
        sentences = memory[:, 0, 0].long().repeat_interleave(rows_per_sentence).tolist()  # (N,)
        rows = [
            self._log_probs(sent, tuple(prefix[1:]))
            for sent, prefix in zip(sentences, prefixes.tolist(), strict=True)
        ]
        return torch.stack(rows).unsqueeze(1)  # (N, 1, V) logits = log-probs

    def _log_probs(self, sentence: int, prefix: tuple[int, ...]) -> Tensor:
        probs = self.script.get((sentence, prefix), self.script.get(prefix, self.default))
        rest = max(1.0 - sum(probs.values()), 1e-6) / (self.vocab_size - len(probs))
        row = torch.full((self.vocab_size,), math.log(rest))
        for token, p in probs.items():
            row[token] = math.log(p)
        return row


# The tiny model (tests/conftest.py) as search tests use it: tiny_model(seed=..., **SEARCH_MODEL).
# Pre-norm with untied, randomly scaled output weights keeps it from repeating one token forever,
# so its greedy outputs vary and end with EOS.
SEARCH_MODEL = dict(
    n_heads=4, dropout=0.0, norm_first=True, share_embeddings=False, tie_output=False,
    output_std=0.5,
)  # fmt: skip


def random_sources(lengths: list[int], vocab_size: int = 40, seed: int = 1) -> Tensor:
    """Source ids (B, S): random real tokens, EOS, right-padded to the longest."""
    gen = torch.Generator().manual_seed(seed)
    src_ids = torch.full((len(lengths), max(lengths) + 1), SPECIAL.pad, dtype=torch.long)
    for i, n in enumerate(lengths):
        src_ids[i, :n] = torch.randint(4, vocab_size, (n,), generator=gen)
        src_ids[i, n] = SPECIAL.eos
    return src_ids


# 40 German-English pairs: enough for a ~90-piece SentencePiece model.
PAIRS = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bike."),
    ("Zwei Hunde spielen im Park.", "Two dogs play in the park."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Das Kind isst einen Apfel.", "The child eats an apple."),
    ("Ein Hund läuft am Strand.", "A dog runs on the beach."),
    ("Zwei Männer spielen Fußball.", "Two men play soccer."),
    ("Eine Katze schläft auf dem Sofa.", "A cat sleeps on the sofa."),
    ("Der Mann trinkt Kaffee.", "The man drinks coffee."),
    ("Die Frau singt ein Lied.", "The woman sings a song."),
    ("Ein Junge springt ins Wasser.", "A boy jumps into the water."),
    ("Ein Mädchen malt ein Bild.", "A girl paints a picture."),
    ("Drei Kinder laufen nach Hause.", "Three children walk home."),
    ("Der Hund bellt laut.", "The dog barks loudly."),
    ("Eine Frau fährt ein Auto.", "A woman drives a car."),
    ("Zwei Frauen sitzen auf einer Bank.", "Two women sit on a bench."),
    ("Ein Mann spielt Gitarre.", "A man plays the guitar."),
    ("Die Kinder lachen.", "The children laugh."),
    ("Ein alter Mann geht spazieren.", "An old man goes for a walk."),
    ("Ein Vogel sitzt auf dem Baum.", "A bird sits on the tree."),
    ("Die Sonne scheint.", "The sun is shining."),
    ("Es regnet in der Stadt.", "It is raining in the city."),
    ("Ein Mann kocht das Essen.", "A man cooks the food."),
    ("Eine Frau trägt einen roten Hut.", "A woman wears a red hat."),
    ("Zwei Jungen schwimmen im See.", "Two boys swim in the lake."),
    ("Der Zug fährt schnell.", "The train goes fast."),
    ("Ein Mädchen tanzt auf der Straße.", "A girl dances on the street."),
    ("Der Lehrer schreibt an die Tafel.", "The teacher writes on the board."),
    ("Ein Mann repariert ein Fahrrad.", "A man repairs a bike."),
    ("Die Frau kauft Brot.", "The woman buys bread."),
    ("Ein Hund fängt einen Ball.", "A dog catches a ball."),
    ("Zwei Kinder bauen eine Sandburg.", "Two children build a sand castle."),
    ("Ein Mann liest die Zeitung.", "A man reads the newspaper."),
    ("Eine Gruppe wandert in den Bergen.", "A group hikes in the mountains."),
    ("Der Junge trinkt Milch.", "The boy drinks milk."),
    ("Eine Frau lächelt.", "A woman smiles."),
    ("Ein Arbeiter baut ein Haus.", "A worker builds a house."),
    ("Die Musiker spielen auf der Bühne.", "The musicians play on the stage."),
    ("Ein Kind schläft im Bett.", "A child sleeps in bed."),
    ("Zwei Hunde rennen über die Wiese.", "Two dogs run across the meadow."),
    ("Ein Mann fotografiert die Stadt.", "A man photographs the city."),
]


def tiny_tokenizer(out_dir: Path, vocab_size: int = 90) -> Tokenizer:
    """A joint ~90-piece SentencePiece tokenizer trained on PAIRS (saved in `out_dir`)."""
    rows = {"src": [src for src, _ in PAIRS], "tgt": [tgt for _, tgt in PAIRS]}
    cfg = TokenizerConfig(vocab_size=vocab_size, input_sentence_size=0)
    return train_or_load_tokenizer(datasets.Dataset.from_dict(rows), cfg, out_dir)
