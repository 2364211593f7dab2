"""Translator: text in, text out (encode -> batch -> search -> decode).

Legend: B batch, S src len, T tgt len, L decoder layers, H heads.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnmt.common import runtime
from attnmt.data.batching import encode_source_batch, pad_rows
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding import constraints as lexical
from attnmt.decoding.alignment import Alignment, word_alignment
from attnmt.decoding.glossary import Glossary, GlossaryError, annotated_sources
from attnmt.decoding.scoring import TokenScores, score_batch
from attnmt.decoding.search import (
    Hypothesis,
    SearchConfig,
    beam_search,
    greedy_search,
    prefix_tensor,
    sample_search,
)

logger = logging.getLogger(__name__)


class TextHypothesis(NamedTuple):
    """One translation with its search score (log-probability / length penalty)."""

    text: str
    score: float
    tokens: list[int]  # target ids without bos/eos


class SentenceAttention(NamedTuple):
    """Cross-attention of one translated sentence, for heatmaps."""

    src_pieces: list[str]  # S source pieces, ending in "</s>"
    tgt_pieces: list[str]  # T generated pieces, ending in "</s>"
    cross_attn: Tensor  # (L, H, T, S) float32 on the CPU; row t is the step that produced piece t


class Translator:
    """Translates lists of sentences with greedy or beam search (`search_cfg.beam_size`), or
    samples translations (`search_cfg.sampling`); scores given translations (`score`) and
    aligns words through cross-attention (`align`).

    Sentences are sorted by length and searched in batches of `search_cfg.batch_size`, so
    that padding stays small; results come back in input order. Greedy search on a model that
    offers continuous batching (`decoding.search.ContinuousGreedy`: one float `engine.Engine`),
    with `inter_threads` 1, keeps `batch_size` sentences in flight instead: a finished
    sentence's row takes the next one at once, with the same outputs up to float rounding.
    Empty (or whitespace-only) sentences give empty translations without reaching the model.
    A target prefix per sentence (`prefixes`) is forced, then searched on (`decoding.search`).
    With a `glossary` (`decoding.glossary.Glossary`), the sentences that hold one of its
    source terms are searched with lexical constraints (their target terms must appear, as
    written): the constrained beam search, greedy included, in batches of their own; the
    other sentences are searched as without a glossary.
    Sampling draws from one random generator seeded with `search_cfg.seed` when the
    `Translator` is made, so the same inputs in the same order give the same samples; it
    searches one batch at a time whatever `inter_threads` says.
    The model is put in eval mode while translating and restored afterwards, so a trainer can
    call this mid-training.

    `inter_threads` > 1 searches that many batches at once, each on a thread of its own,
    with torch's intra-op threads divided among them (CTranslate2's `inter_threads`;
    Marian's `--cpu-threads` workers). The results are the same; on a CPU it pays where one
    batch's ops are too small to keep every core busy (2 cores, the default Multi30k model:
    see docs/benchmarks.md). The caller's autocast (bf16) reaches the worker threads.

    Args:
        model: what search runs (`decoding.search.Seq2SeqModel`): a `model.Transformer`, an
            `engine.Engine` built from one (what `translate.py` uses), or an `Ensemble`;
            already on `device`.
        tokenizer: the tokenizer the model was trained with.
        search_cfg: decoding options; the defaults of `SearchConfig` when None.
        device: where the inputs go; the model's device when None.
        inter_threads: batches searched at once (default 1: one after the other).
        stop: checked before each decoding step; when it says so, the search raises
            `search.Cancelled` (serve.py's model thread: every client of the batch gone).

    Example:
        >>> translator = Translator(model, tokenizer, SearchConfig(beam_size=5))
        >>> translator.translate(["Ein Mann fährt Fahrrad."])
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        search_cfg: SearchConfig | None = None,
        device: str | torch.device | None = None,
        inter_threads: int = 1,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        if inter_threads < 1:
            raise ValueError(f"inter_threads must be >= 1, got {inter_threads}")
        self.model = model
        self.tokenizer = tokenizer
        self.search_cfg = search_cfg or SearchConfig()
        self.device = torch.device(device) if device is not None else _device_of(model)
        self.inter_threads = inter_threads
        self.stop = stop  # checked between decoding steps: `search.Cancelled` when it says so
        self._pool: ThreadPoolExecutor | None = None  # made at the first parallel search
        self._by_languages: dict[tuple[str | None, str | None], Tokenizer] = {}
        self._term_ids: dict[tuple[int, str], list[list[int]]] = {}  # (tokenizer, term): variants
        self._pieces: dict[int, lexical.Pieces] = {}  # tokenizer: `piece_classes`
        self.generator = torch.Generator(self.device).manual_seed(self.search_cfg.seed)

    def translate(
        self,
        sentences: list[str],
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        glossary: Glossary | None = None,
    ) -> list[str]:
        """The best translation of each sentence, in input order."""
        nbest = self.translate_nbest(
            sentences, src_lang=src_lang, tgt_lang=tgt_lang, glossary=glossary
        )
        return [hypotheses[0].text for hypotheses in nbest]

    def languages(self, src_lang: str | None, tgt_lang: str | None) -> Tokenizer:
        """The tokenizer for a language pair of a multilingual imported model (None: the
        model's own; see `Tokenizer.for_languages`, whose `DataError` names the codes)."""
        key = (src_lang, tgt_lang)
        if key not in self._by_languages:
            self._by_languages[key] = self.tokenizer.for_languages(src_lang, tgt_lang)
        return self._by_languages[key]

    def translate_nbest(
        self,
        sentences: list[str],
        progress: Callable[[int], object] | None = None,
        prefixes: list[str] | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        glossary: Glossary | list[Glossary | None] | None = None,
    ) -> list[list[TextHypothesis]]:
        """Up to `search_cfg.nbest` translations per sentence, best first, in input order.

        An empty sentence gets one empty hypothesis with score 0. `progress(n)` is called
        as sentences are done (n at a time; the counts add up to `len(sentences)`).
        `prefixes` (one per sentence, "" for none) are the start of each translation: their
        subwords are forced, and the translations include them. `src_lang`/`tgt_lang`: the
        pair of a multilingual imported model, whose target language token is forced first
        and left out of the translations. `glossary`: terms the translations must use; one
        glossary (or None) per sentence where sentences of several requests are translated
        together (the server's batches).

        Raises:
            GlossaryError: a term found in a sentence is longer than that sentence's output
                budget (`max_len_a`, `max_len_b`), or has no subwords the model can write.
        """
        encoded = self._encode(sentences, prefixes, src_lang, tgt_lang, glossary)
        tokenizer, src_ids, prefix_ids, given = encoded
        terms = self._terms(tokenizer, glossary, sentences, src_ids, prefix_ids)
        if terms is not None:
            usual = self._learn_usual(tokenizer, glossary, sentences, src_ids)
            terms = self._avoiding(tokenizer, glossary, sentences, src_ids, terms, usual)
        hypotheses = self.search_ids(src_ids, progress, prefix_ids, len(given), terms)
        for nbest in hypotheses:  # the language token is not part of the translation
            for i, hyp in enumerate(nbest):
                nbest[i] = hyp._replace(tokens=hyp.tokens[len(given) :])
        tokens = [hyp.tokens for nbest in hypotheses for hyp in nbest]
        texts = iter(tokenizer.decode_tgt(tokens) if tokens else [])
        return [
            [TextHypothesis(next(texts), hyp.score, hyp.tokens) for hyp in nbest]
            for nbest in hypotheses
        ]

    def check_terms(
        self,
        sentences: list[str],
        glossary: Glossary | list[Glossary | None] | None,
        prefixes: list[str] | None = None,
    ) -> None:
        """Raise the `GlossaryError` that `translate_nbest` would raise for these inputs,
        without searching (the server checks each request before it joins a batch)."""
        tokenizer, src_ids, prefix_ids, _ = self._encode(sentences, prefixes, None, None, glossary)
        self._terms(tokenizer, glossary, sentences, src_ids, prefix_ids)

    def _encode(
        self,
        sentences: list[str],
        prefixes: list[str] | None,
        src_lang: str | None,
        tgt_lang: str | None,
        glossary: Glossary | list[Glossary | None] | None = None,
    ) -> tuple[Tokenizer, list[list[int]], list[list[int]] | None, list[int]]:
        """(the pair's tokenizer, source ids, forced target ids or None, the given target
        ids: a multilingual model's language token, which starts every forced prefix). A
        model trained with term annotation gets `glossary`'s terms annotated in its sources."""
        if isinstance(sentences, str):
            raise TypeError("translate takes a list of sentences, not a string")
        tokenizer = self.languages(src_lang, tgt_lang)
        sources = annotated_sources(tokenizer.tags, sentences, glossary)
        src_ids = tokenizer.encode_src([s.strip() for s in sources])
        prefix_ids = None
        if prefixes is not None:
            if len(prefixes) != len(sentences):
                raise ValueError(f"{len(prefixes)} prefixes for {len(sentences)} sentences")
            prefix_ids = tokenizer.encode_tgt([p.strip() for p in prefixes])
        given = tokenizer.target_prefix()
        if given:
            prefix_ids = [given + ids for ids in prefix_ids or [[] for _ in src_ids]]
        return tokenizer, src_ids, prefix_ids, given

    def _terms(
        self,
        tokenizer: Tokenizer,
        glossary: Glossary | list[Glossary | None] | None,
        sentences: list[str],
        src_ids: list[list[int]],
        prefix_ids: list[list[int]] | None,
    ) -> list[list[list[list[int]]]] | None:
        """Per sentence, the terms of its glossary found in it, each as its target's variants;
        None without a glossary."""
        glossaries = glossary if isinstance(glossary, list) else [glossary] * len(sentences)
        if len(glossaries) != len(sentences):
            raise ValueError(f"{len(glossaries)} glossaries for {len(sentences)} sentences")
        if not any(g is not None and len(g) for g in glossaries):
            return None
        cfg, found = self.search_cfg, []
        for i, sentence in enumerate(sentences):
            variants, own = [], glossaries[i]
            for term in own.find(sentence) if src_ids[i] and own is not None else []:
                key = (id(tokenizer), term.target)
                if key not in self._term_ids:
                    if len(self._term_ids) > 100_000:  # per-request glossaries: stay bounded
                        self._term_ids.clear()
                    self._term_ids[key] = lexical.term_variants(tokenizer, term.target)
                variants.append(self._term_ids[key])
                budget = math.floor(len(src_ids[i]) * cfg.max_len_a + cfg.max_len_b)
                budget = max(budget, len(prefix_ids[i]) if prefix_ids else 0)
                shortest = min(len(v) for v in variants[-1])
                if shortest == 0:
                    raise GlossaryError(
                        f"{term.origin}: the target term {term.target!r} has no subwords the "
                        "model can write; give a term in the model's target script"
                    )
                if shortest > budget:
                    raise GlossaryError(
                        f"{term.origin}: the target term {term.target!r} takes {shortest} "
                        f"subwords, more than the output budget ({budget}) of a sentence that "
                        f"holds {term.source!r}; shorten the term or raise max_len_a/max_len_b"
                    )
            found.append(variants)
        return found

    def _learn_usual(
        self,
        tokenizer: Tokenizer,
        glossary: Glossary | list[Glossary | None],
        sentences: list[str],
        src_ids: list[list[int]],
    ) -> dict[tuple[int, str], list[set[str]]]:
        """The words the model writes for each source term without a glossary, learnt from the
        first `USUAL_SAMPLE` sentences of this call that hold it (never from another call, so
        one request's text never changes another's answer): in their greedy translations,
        the words whose log-probability falls by `USUAL_DROP` or more once the term is deleted
        from the source, in at least half of them (`decoding.constraints.usual_words`)."""
        glossaries = glossary if isinstance(glossary, list) else [glossary] * len(sentences)
        usual: dict[tuple[int, str], list[set[str]]] = {}
        sample: dict[tuple[int, str], list[int]] = {}
        for i, (sentence, own) in enumerate(zip(sentences, glossaries, strict=True)):
            for term in own.find(sentence) if own is not None and src_ids[i] else []:
                key = (id(tokenizer), term.source.casefold())
                if len(sample.setdefault(key, [])) < USUAL_SAMPLE:
                    sample[key].append(i)
        sample = {key: picked for key, picked in sample.items() if picked}
        if not sample:
            return usual
        rows = sorted({i for picked in sample.values() for i in picked})
        sources = [src_ids[i] for i in rows]
        given = tokenizer.target_prefix()
        outputs = dict(zip(rows, self._greedy_ids(sources, given), strict=True))
        pairs = [(key, i) for key, picked in sample.items() for i in picked]
        held = self.score_ids(sources, [given + outputs[i] for i in rows], len(given))
        scored = dict(zip(rows, held, strict=True))
        deleted = [_without(sentences[i], key[1]) for key, i in pairs]
        lacking = self.score_ids(
            tokenizer.encode_src(deleted), [given + outputs[i] for _, i in pairs], len(given)
        )
        found: dict[tuple[int, str], list[set[str]]] = {key: [] for key in sample}
        for (key, i), without in zip(pairs, lacking, strict=True):
            n = len(outputs[i])
            found[key].append(
                lexical.salient_words(
                    tokenizer.tgt_pieces(outputs[i]),
                    scored[i].token_log_probs[len(given) : len(given) + n],
                    without.token_log_probs[len(given) : len(given) + n],
                    USUAL_DROP,
                )
            )
        return found

    def _greedy_ids(self, src_ids: list[list[int]], given: list[int]) -> list[list[int]]:
        """The greedy translation of each source, without terms, as target ids (no `given`)."""
        cfg = replace(self.search_cfg, beam_size=1, nbest=1, sampling=False)
        special, outputs = self.tokenizer.special, []
        with self._eval_mode():
            for start in range(0, len(src_ids), cfg.batch_size):
                chunk = src_ids[start : start + cfg.batch_size]
                src = encode_source_batch(chunk, special).to(self.device)
                prefix = prefix_tensor([given] * len(chunk), self.device) if given else None
                found = greedy_search(self.model, src, special, cfg, prefix, len(given))
                outputs += [nbest[0].tokens[len(given) :] for nbest in found.hypotheses]
        return outputs

    def _avoiding(
        self,
        tokenizer: Tokenizer,
        glossary: Glossary | list[Glossary | None],
        sentences: list[str],
        src_ids: list[list[int]],
        terms: list[list[list[list[int]]]],
        usual: dict[tuple[int, str], list[set[str]]],
    ) -> list[list[list[list[int]]]]:
        """`terms` with each term's usual words to avoid (`lexical.TermIds`): the learnt usual
        words of its source term, but none the target term holds or that holds it (a usual
        glossary's term is never avoided)."""
        glossaries = glossary if isinstance(glossary, list) else [glossary] * len(sentences)
        done: dict[tuple[str, str], lexical.TermIds] = {}
        found = []
        for i, (sentence, own) in enumerate(zip(sentences, glossaries, strict=True)):
            held = own.find(sentence) if own is not None and src_ids[i] else []
            for term, variants in zip(held, terms[i], strict=True):
                if (term.source, term.target) not in done:
                    source, target = term.source.casefold(), term.target.casefold()
                    words = set(lexical.usual_words(usual.get((id(tokenizer), source), [])))
                    words = {w for w in words if w.casefold() not in target}
                    words = {w for w in words if target not in w.casefold()}
                    avoid = [v for w in sorted(words) for v in lexical.term_variants(tokenizer, w)]
                    done[(term.source, term.target)] = lexical.TermIds(variants, avoid)
            found.append([done[(t.source, t.target)] for t in held])
        return found

    def search_ids(
        self,
        src_ids: list[list[int]],
        progress: Callable[[int], object] | None = None,
        prefix_ids: list[list[int]] | None = None,
        given: int = 0,
        terms: list[list[list[list[int]]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Search source id lists (no specials) in length-sorted batches; input order out.

        `progress(n)`, if given, is called with the number of empty sentences first, then
        after each batch with its size (greedy with continuous batching: as sentences finish).
        `prefix_ids` are forced target ids per sentence (None: no prefixes), whose first
        `given` tokens score 0 (`decoding.search`). `terms`: per sentence, the target terms it
        must use, each a list of variants (token id lists; `decoding.constraints`).
        """
        if prefix_ids is not None and not any(prefix_ids):
            prefix_ids = None
        if terms is not None and any(terms):
            return self._search_constrained(src_ids, progress, prefix_ids, given, terms)
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
        batches = length_sorted_batches(src_ids, self.search_cfg.batch_size)
        n_empty = len(src_ids) - sum(len(chunk) for chunk in batches)
        if progress is not None and n_empty:
            progress(n_empty)
        if self._continuous() and prefix_ids is None:
            order = [i for chunk in batches for i in chunk]
            with self._eval_mode():
                sources = [src_ids[i] for i in order]
                special, cfg = self.tokenizer.special, self.search_cfg
                stop = {"stop": self.stop} if self.stop is not None else {}
                found = self.model.greedy_search_continuous(sources, special, cfg, progress, **stop)
            for i, nbest in zip(order, found, strict=True):
                results[i] = nbest
            return results
        with self._eval_mode():
            searched = self._search_all(src_ids, batches, prefix_ids, given)
            for chunk, found in zip(batches, searched, strict=True):
                for i, nbest in zip(chunk, found, strict=True):
                    results[i] = nbest
                if progress is not None:
                    progress(len(chunk))
        return results

    def _search_constrained(
        self,
        src_ids: list[list[int]],
        progress: Callable[[int], object] | None,
        prefix_ids: list[list[int]] | None,
        given: int,
        terms: list[list[list[list[int]]]],
    ) -> list[list[Hypothesis]]:
        """`search_ids` where some sentences have terms: those are searched with constraints
        in length-sorted batches of their own, the others as without terms."""
        if self.search_cfg.sampling:
            raise ValueError("terms (a glossary) need beam or greedy search, not sampling")
        bound = [i for i, ids in enumerate(src_ids) if ids and terms[i]]
        free = sorted(set(range(len(src_ids))) - set(bound))
        results: list[list[Hypothesis]] = [[] for _ in src_ids]

        def subset(rows: list | None, picked: list[int]) -> list | None:
            return None if rows is None else [rows[i] for i in picked]

        if free:
            sources = subset(src_ids, free)
            found = self.search_ids(sources, progress, subset(prefix_ids, free), given)
            for i, nbest in zip(free, found, strict=True):
                results[i] = nbest
        sources = [src_ids[i] for i in bound]
        batches = length_sorted_batches(sources, self.search_cfg.batch_size)
        prefixes, bound_terms = subset(prefix_ids, bound), subset(terms, bound)
        with self._eval_mode():
            searched = self._search_all(sources, batches, prefixes, given, bound_terms)
            for chunk, nbests in zip(batches, searched, strict=True):
                for j, nbest in zip(chunk, nbests, strict=True):
                    results[bound[j]] = nbest
                if progress is not None:
                    progress(len(chunk))
        return results

    def _continuous(self) -> bool:
        """Whether greedy search runs with continuous batching: a model that offers it (an
        `engine.Engine` that is not int8: see `decoding.search.ContinuousGreedy`), one batch at
        a time."""
        return (
            self.search_cfg.beam_size == 1
            and not self.search_cfg.sampling
            and self.inter_threads == 1
            and getattr(self.model, "continuous_batching", False)
        )

    def _search_all(
        self,
        src_ids: list[list[int]],
        batches: list[list[int]],
        prefix_ids: list[list[int]] | None = None,
        given: int = 0,
        terms: list[list[list[list[int]]]] | None = None,
    ) -> Iterator[list[list[Hypothesis]]]:
        """Each batch's hypotheses, in batch order: one after the other, or `inter_threads`
        at once on a thread pool, torch's intra-op threads divided among them meanwhile
        (never when sampling: one generator draws for every batch, in order)."""

        def search(chunk: list[int]) -> list[list[Hypothesis]]:
            prefix = None if prefix_ids is None else [prefix_ids[i] for i in chunk]
            chunk_terms = None if terms is None else [terms[i] for i in chunk]
            return self._search([src_ids[i] for i in chunk], prefix, given, chunk_terms)

        if self.inter_threads == 1 or len(batches) < 2 or self.search_cfg.sampling:
            for chunk in batches:
                yield search(chunk)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.inter_threads, thread_name_prefix="search")
        context = runtime.autocast_of(self.device.type)  # thread-local: each worker enters it again
        threads = torch.get_num_threads()
        intra = max(1, threads // self.inter_threads)

        def search_in_thread(chunk: list[int]) -> list[list[Hypothesis]]:
            torch.set_num_threads(intra)  # OpenMP's team size is per thread: set it in each
            with context():
                return search(chunk)

        try:  # the workers' set_num_threads changes torch's process-wide count too
            yield from self._pool.map(search_in_thread, batches)
        finally:
            torch.set_num_threads(threads)

    def attention_for(self, sentence: str) -> SentenceAttention:
        """Translate one sentence and return its cross-attention weights of every layer.

        The weights come from a teacher-forced pass over [bos] + the best hypothesis, which
        equals what the search computed step by step.

        Raises:
            ValueError: the sentence is empty.
        """
        ids = self.tokenizer.encode_src([sentence.strip()])[0]
        if not ids:
            raise ValueError("cannot show attention for an empty sentence")
        special, given = self.tokenizer.special, self.tokenizer.target_prefix()
        hyp = self.search_ids([ids], prefix_ids=[given] if given else None, given=len(given))[0][0]
        src = encode_source_batch([ids], special).to(self.device)  # (1, S)
        tgt_in = torch.tensor([[special.bos] + hyp.tokens], device=self.device)  # (1, T)
        with self._eval_mode():
            maps = self.model.attention_maps(src, tgt_in)
        cross = torch.stack([layer[0] for layer in maps.cross]).float().cpu()  # (L, H, T, S)
        return SentenceAttention(
            self.tokenizer.src_pieces(ids + [special.eos]),
            self.tokenizer.tgt_pieces(hyp.tokens + [special.eos]),
            cross,
        )

    def _search(
        self,
        batch: list[list[int]],
        prefix_ids: list[list[int]] | None = None,
        given: int = 0,
        terms: list[list[list[list[int]]]] | None = None,
    ) -> list[list[Hypothesis]]:
        cfg, special = self.search_cfg, self.tokenizer.special
        src = encode_source_batch(batch, special).to(self.device)  # (B, S)
        prefix = None if prefix_ids is None else prefix_tensor(prefix_ids, self.device)  # (B, P)
        if cfg.sampling:
            generator, stop = self.generator, self.stop
            found = sample_search(self.model, src, special, cfg, prefix, generator, given, stop)
            return found.hypotheses
        cons = None
        if terms is not None:
            key = id(self.tokenizer)
            if key not in self._pieces:
                self._pieces[key] = lexical.piece_classes(self.tokenizer, special.bos)
            pieces = self._pieces[key]
            limits = lexical.final_marks(batch, pieces.src_final)
            cons = lexical.constraint_set(
                terms, pieces.glued, pieces.opener, self.device, pieces.final, limits
            )
        search = greedy_search if cfg.beam_size == 1 else beam_search
        return search(self.model, src, special, cfg, prefix, given, cons, self.stop).hypotheses

    def score(
        self,
        sentences: list[str],
        translations: list[str],
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> list[TokenScores]:
        """Scores of given translations (teacher-forced, no search), in input order: the
        log-probability of each translation's subwords and EOS, and that divided by the
        length penalty of `search_cfg` (the `score` search reports for the same output).
        A pair whose source and translation are both empty scores 0 without the model.
        A multilingual imported model's target language token (`src_lang`/`tgt_lang`) comes
        first, scores 0 and counts in the length, as in search."""
        if len(sentences) != len(translations):
            raise ValueError(f"{len(translations)} translations for {len(sentences)} sentences")
        tokenizer = self.languages(src_lang, tgt_lang)
        src_ids = tokenizer.encode_src([s.strip() for s in sentences])
        given = tokenizer.target_prefix()
        tgt_ids = [given + ids for ids in tokenizer.encode_tgt([t.strip() for t in translations])]
        return self.score_ids(src_ids, tgt_ids, given=len(given))

    def score_ids(
        self, src_ids: list[list[int]], tgt_ids: list[list[int]], given: int = 0
    ) -> list[TokenScores]:
        """`score` on id lists (no specials); the first `given` target ids score 0."""
        results = [TokenScores(0.0, 0.0, []) for _ in src_ids]
        pairs = [i for i in range(len(src_ids)) if src_ids[i] or tgt_ids[i]]
        pairs.sort(key=lambda i: -(len(src_ids[i]) + len(tgt_ids[i])))
        size = self.search_cfg.batch_size
        with self._eval_mode():
            for start in range(0, len(pairs), size):
                chunk = pairs[start : start + size]
                scores = score_batch(
                    self.model,
                    [src_ids[i] for i in chunk],
                    [tgt_ids[i] for i in chunk],
                    self.tokenizer.special,
                    self.search_cfg,
                    self.device,
                    given,
                )
                for i, scored in zip(chunk, scores, strict=True):
                    results[i] = scored
        return results

    def align(
        self, src_ids: list[list[int]], tgt_ids: list[list[int]], layer: int | None = None
    ) -> list[Alignment]:
        """Word alignments (`decoding.alignment`) of sources and their translations (id lists,
        no specials) from the cross-attention of decoder layer `layer` (0-based; negative
        counts from the top; None: the penultimate, see `decoding.alignment`), averaged over
        heads; teacher-forced, in batches of `batch_size`."""
        special, given = self.tokenizer.special, self.tokenizer.target_prefix()
        results: list[Alignment] = [[] for _ in src_ids]
        pairs = [i for i in range(len(src_ids)) if src_ids[i] and tgt_ids[i]]
        size = self.search_cfg.batch_size
        with self._eval_mode(), torch.inference_mode():
            for start in range(0, len(pairs), size):
                chunk = pairs[start : start + size]
                src = encode_source_batch([src_ids[i] for i in chunk], special).to(self.device)
                tgt_rows = [given + tgt_ids[i] for i in chunk]  # NLLB: its language token
                tgt_in = pad_rows(tgt_rows, special.pad, prefix=[special.bos]).to(self.device)
                maps = self.model.attention_maps(src, tgt_in).cross  # L x (B, H, T, S)
                weights = maps[_layer_index(layer, len(maps))].float().mean(dim=1).cpu()
                for row, i in enumerate(chunk):
                    rows = slice(len(given), len(given) + len(tgt_ids[i]) + 1)
                    cross = weights[row, rows, : len(src_ids[i]) + 1]
                    results[i] = word_alignment(
                        cross,
                        self.tokenizer.src_pieces(src_ids[i]),
                        self.tokenizer.tgt_pieces(tgt_ids[i]),
                    )
        return results

    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Eval mode (no dropout) for the duration; the caller's mode is restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)


# Sentences per source term whose unconstrained greedy translations say its usual words, and
# how far (nats) a word's log-probability must fall once the term is deleted from the source.
USUAL_SAMPLE = 8
USUAL_DROP = 2.0


def _without(sentence: str, source: str) -> str:
    """`sentence` with the source term `source` (whole words, any case) deleted."""
    pattern = r"\s+".join(map(re.escape, source.split()))
    kept = re.sub(rf"(?<!\w){pattern}(?!\w)", " ", sentence, flags=re.IGNORECASE)
    return " ".join(kept.split())


def length_sorted_batches(src_ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """The batches `Translator.search_ids` searches: indices of the non-empty sources, longest
    first, `batch_size` at a time (benchmarks give peers the same batches)."""
    order = sorted((i for i, ids in enumerate(src_ids) if ids), key=lambda i: -len(src_ids[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _layer_index(layer: int | None, n_layers: int) -> int:
    """`layer` (negative: from the top; None: the penultimate, or the only one) as an index."""
    if layer is None:
        return max(0, n_layers - 2)
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"alignment layer {layer} does not exist: the decoder has {n_layers}")
    return layer % n_layers


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
