"""translate.py beyond "translate this": scoring given translations, sampling, a forced target
prefix, word alignments; through `Translator` and the command line.

The tiny random model (tests/conftest.py) is enough: each test checks a relation that holds for
any weights (scores reproduce, prefixes are forced, seeds repeat, samples follow the softmax).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnmt.cli import translate as cli
from attnmt.data.batching import encode_source_batch
from attnmt.decoding.alignment import format_alignment, word_alignment, word_ids
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.ensemble import Ensemble
from attnmt.decoding.search import greedy_search, sample_search, sample_tokens
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from tests.helpers_decoding import PAIRS, SPECIAL, ScriptedModel, UncachedModel, single_thread
from tests.test_translate_cli import assert_one_line_error, call_main, run_cli

SOURCES = [src for src, _ in PAIRS[:6]]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


# ------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("lp", [(1.0, "fairseq"), (0.6, "gnmt"), (0.0, "fairseq")])
def test_scores_of_beam_output_equal_the_search_scores(model, tokenizer, lp) -> None:  # noqa: ANN001
    """Every n-best hypothesis of beam search, scored teacher-forced, gets the search's
    log-probability and length-normalised score back."""
    alpha, lp_type = lp
    cfg = SearchConfig(beam_size=4, nbest=4, length_penalty=alpha, lp_type=lp_type)
    translator = Translator(Engine(model), tokenizer, cfg)
    src_ids = tokenizer.encode_src(SOURCES)
    found = translator.search_ids(src_ids)
    pairs = [(i, hyp) for i, nbest in enumerate(found) for hyp in nbest]
    scored = translator.score_ids([src_ids[i] for i, _ in pairs], [h.tokens for _, h in pairs])
    for (_, hyp), got in zip(pairs, scored, strict=True):
        assert len(got.token_log_probs) == len(hyp.tokens) + 1  # subwords + EOS
        assert got.log_prob == pytest.approx(hyp.log_prob, abs=1e-4)
        assert got.score == pytest.approx(hyp.score, abs=1e-4)
        assert sum(got.token_log_probs) == pytest.approx(got.log_prob, abs=1e-5)


def test_score_is_the_teacher_forced_log_likelihood(model, tokenizer) -> None:  # noqa: ANN001
    """log p(y | x) = sum_t log_softmax(model(x, [bos] + y))[t, y_t], EOS included."""
    translator = Translator(model, tokenizer, SearchConfig(length_penalty=0.0))
    src, tgt = tokenizer.encode_src([SOURCES[0]])[0], tokenizer.encode_tgt(["A man rides."])[0]
    got = translator.score_ids([src], [tgt])[0]
    src_t = encode_source_batch([src], tokenizer.special)
    tgt_in = torch.tensor([[tokenizer.special.bos, *tgt]])
    with torch.no_grad():
        lprobs = torch.log_softmax(model(src_t, tgt_in).float(), dim=-1)[0]  # (T, V)
    target = [*tgt, tokenizer.special.eos]
    expected = [lprobs[t, y].item() for t, y in enumerate(target)]
    assert got.token_log_probs == pytest.approx(expected, abs=1e-5)
    assert got.score == pytest.approx(sum(expected), abs=1e-5)  # alpha 0: no normalisation


def test_score_cli_reproduces_nbest_scores_and_streams(
    checkpoint: Path, model, tokenizer, tmp_path: Path
) -> None:  # noqa: ANN001
    """translate.py --nbest prints scores; --score of those translations prints the same ones,
    one line per input line, in batches of --buffer-size; --token-scores adds the terms.

    --score re-tokenizes the text, so only translations whose subwords are the tokenizer's
    own segmentation of their text can give the search's score back: the random model also
    emits others (a trained one rarely does), which are left out."""
    run_dir = str(checkpoint.parents[1])
    nbest = run_cli("-c", run_dir, "--beam", "5", "--nbest", "5", *SOURCES)
    assert nbest.returncode == 0, nbest.stderr.decode()
    rows = [line.split(" ||| ") for line in nbest.stdout.decode().splitlines()]
    cfg = SearchConfig(beam_size=5, nbest=5)
    tokens = [h.tokens for hyps in Translator(model, tokenizer, cfg).translate_nbest(SOURCES)
              for h in hyps]  # fmt: skip
    again = tokenizer.encode_tgt([text for _, text, _ in rows])
    rows = [row for row, a, b in zip(rows, again, tokens, strict=True) if a == b]
    (tmp_path / "src").write_text("".join(SOURCES[int(i)] + "\n" for i, _, _ in rows))
    (tmp_path / "hyp").write_text("".join(text + "\n" for _, text, _ in rows))
    scored = run_cli(
        "-c", run_dir, "--input", str(tmp_path / "src"), "--score", str(tmp_path / "hyp"),
        "--buffer-size", "2", "--token-scores",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr.decode()
    lines = scored.stdout.decode().splitlines()
    assert len(lines) == len(rows) >= 2
    for (_, _, score), line in zip(rows, lines, strict=True):
        got_score, log_prob, length, terms = line.split("\t")
        assert float(got_score) == pytest.approx(float(score), abs=2e-4)
        assert len(terms.split()) == int(length)
        assert sum(map(float, terms.split())) == pytest.approx(float(log_prob), abs=1e-3)


def test_score_reads_both_files_a_batch_at_a_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path
) -> None:  # noqa: ANN001
    """Bounded memory: each call scores at most --buffer-size lines, however long the files."""
    (tmp_path / "src").write_text("\n".join(SOURCES * 3) + "\n")
    (tmp_path / "hyp").write_text("\n".join(["A man."] * len(SOURCES) * 3) + "\n")
    sizes: list[int] = []
    real = Translator.score

    def spy(self: Translator, sentences: list[str], translations: list[str]) -> list:
        sizes.append(len(sentences))
        return real(self, sentences, translations)

    monkeypatch.setattr(Translator, "score", spy)
    args = ("--input", str(tmp_path / "src"), "--score", str(tmp_path / "hyp"))
    status, out, _ = call_main(capsys, "-c", str(checkpoint), *args, "--buffer-size", "4")
    assert status == 0 and len(out.splitlines()) == 18
    assert sizes == [4, 4, 4, 4, 2]


def test_score_errors_are_one_line(
    capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path
) -> None:
    (tmp_path / "src").write_text("a\nb\nc\n")
    (tmp_path / "hyp").write_text("x\ny\n")
    (tmp_path / "out").write_text("keep me\n")
    ck = str(checkpoint)
    src, hyp = str(tmp_path / "src"), str(tmp_path / "hyp")
    cases = [
        (("--input", src, "--score", hyp, "--output", str(tmp_path / "out")), "has 2 lines"),
        (("--score", hyp, "--sampling", "x"), "drop --sampling"),
        (("--score", hyp, "--nbest", "2", "x"), "drop --nbest"),
        (("--score", str(tmp_path / "missing"), "x"), "cannot read --score"),
        (("--token-scores", "x"), "--token-scores goes with --score"),
    ]
    for args, words in cases:
        status, _, err = call_main(capsys, "-c", ck, *args)
        assert status == 1
        assert_one_line_error(err, words)
    assert (tmp_path / "out").read_text() == "keep me\n"  # nothing on disk lost
    # a pipe: the count is known only at the end, and the error still comes as one line
    piped = run_cli("-c", ck, "--score", hyp, stdin="a\nb\nc\n")
    assert piped.returncode == 1
    assert_one_line_error(piped.stderr.decode(), "--score", "input has more")


# ------------------------------------------------------------------------------ sampling


def _expected_distribution(logits: torch.Tensor, cfg: SearchConfig) -> torch.Tensor:
    """softmax(logits / T), keep the top k, then the smallest set reaching p, renormalised;
    computed the slow, obvious way."""
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    order = probs.argsort(descending=True).tolist()
    kept = order[: cfg.topk] if cfg.topk else order
    total = probs[kept].sum()
    chosen, mass = [], 0.0
    for token in kept:
        chosen.append(token)
        mass += (probs[token] / total).item()
        if mass >= cfg.topp:
            break
    out = torch.zeros_like(probs)
    out[chosen] = probs[chosen] / probs[chosen].sum()
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        SearchConfig(sampling=True),
        SearchConfig(sampling=True, temperature=0.5),
        SearchConfig(sampling=True, temperature=2.0, topk=4),
        SearchConfig(sampling=True, topp=0.8),
        SearchConfig(sampling=True, topk=5, topp=0.7, temperature=1.5),
    ],
    ids=["plain", "t0.5", "t2-k4", "p0.8", "k5-p0.7-t1.5"],
)
def test_sampled_tokens_follow_the_shaped_softmax(cfg: SearchConfig) -> None:
    """40k draws of `sample_tokens`: empirical frequencies within 0.015 (total variation) of
    the shaped distribution, no token outside its support, and the returned log-probability
    is the model's own (unshaped) one."""
    V, n = 12, 40_000
    logits = torch.tensor([0.0, 0.0, 0.0, 2.0, 1.5, 1.0, 0.8, 0.5, 0.2, -0.5, -1.0, 1.2])
    special = SPECIAL  # pad 0, bos 2 never drawn; EOS 3 allowed after step 0
    banned = logits.clone()
    banned[[special.pad, special.bos]] = float("-inf")
    expected = _expected_distribution(banned, cfg)
    gen = torch.Generator().manual_seed(0)
    lprob, token = sample_tokens(logits.expand(n, V).clone(), special, cfg, False, None, gen)
    counts = torch.bincount(token.squeeze(1), minlength=V).float() / n
    assert (counts[expected.eq(0)] == 0).all()
    assert 0.5 * (counts - expected).abs().sum().item() < 0.015
    model_lprobs = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(lprob.squeeze(1), model_lprobs[token.squeeze(1)])


@pytest.mark.parametrize(
    ("field", "value", "greedy"),
    [("temperature", 1e-300, True), ("topp", 1e-300, True), ("temperature", 5e-324, True),
     ("temperature", 1e300, False), ("temperature", 1e-30, True)],
)  # fmt: skip
def test_every_accepted_temperature_and_topp_samples_without_nan(
    field: str, value: float, greedy: bool
) -> None:
    """Extreme values SearchConfig accepts draw tokens: tiny ones the most probable (the
    softmax of logits / temperature has no NaN), a huge temperature any allowed token."""
    logits = torch.tensor([0.0, 0.0, 0.0, 2.0, 1.5, 1.0, 0.8, 0.5, 0.2, -0.5, -1.0, 1.2])
    cfg = SearchConfig(sampling=True, **{field: value})
    gen = torch.Generator().manual_seed(0)
    _, token = sample_tokens(logits.expand(400, 12).clone(), SPECIAL, cfg, False, None, gen)
    drawn = set(token.squeeze(1).tolist())
    assert drawn == {3} if greedy else len(drawn) > 5 and not drawn & {SPECIAL.pad, SPECIAL.bos}
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"{field} must be a finite number"):
            SearchConfig(sampling=True, **{field: bad})


def test_sampling_through_search_follows_the_model(tokenizer) -> None:  # noqa: ANN001
    """The first token of 4000 samples of one sentence (a scripted model: p = 0.5/0.3/0.2 over
    three tokens) with temperature 1: frequencies within 0.03 of the script."""
    script = {(): {5: 0.5, 6: 0.3, 7: 0.2}}
    model = ScriptedModel(vocab_size=12, script=script, default={SPECIAL.eos: 1.0})
    cfg = SearchConfig(sampling=True, nbest=4000, max_len_b=3)
    src = torch.tensor([[9, SPECIAL.eos]])
    gen = torch.Generator().manual_seed(1)
    hyps = sample_search(model, src, SPECIAL, cfg, None, gen).hypotheses[0]
    assert len(hyps) == 4000
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    first = Counter(h.tokens[0] for h in hyps)
    for token, p in script[()].items():
        assert abs(first[token] / 4000 - p) < 0.03, (token, first)


def test_sampling_repeats_with_its_seed_and_topk1_is_greedy(model, tokenizer) -> None:  # noqa: ANN001
    def sample(**kw) -> list[list[str]]:  # noqa: ANN003
        cfg = SearchConfig(sampling=True, nbest=3, batch_size=2, **kw)
        nbest = Translator(Engine(model), tokenizer, cfg).translate_nbest(SOURCES)
        return [[h.text for h in hyps] for hyps in nbest]

    assert sample(seed=7) == sample(seed=7)
    assert sample(seed=7) != sample(seed=8)
    greedy = Translator(model, tokenizer, SearchConfig(beam_size=1)).translate(SOURCES)
    assert sample(topk=1) == [[text] * 3 for text in greedy]


def test_sampling_works_on_ensembles_and_equals_the_uncached_model(model, tokenizer) -> None:  # noqa: ANN001
    """The same seed gives the same samples on the KV cache, without it, and on an ensemble
    of two copies (which computes the single model's numbers)."""
    cfg = SearchConfig(sampling=True, nbest=2, topp=0.9, temperature=1.3, seed=3)
    src = encode_source_batch(tokenizer.encode_src(SOURCES), tokenizer.special)

    def tokens(m: torch.nn.Module) -> list[list[list[int]]]:
        gen = torch.Generator().manual_seed(cfg.seed)
        result = sample_search(m, src, tokenizer.special, cfg, None, gen)
        return [[h.tokens for h in hyps] for hyps in result.hypotheses]

    cached = tokens(model)
    assert cached == tokens(UncachedModel(model))
    assert cached == tokens(Ensemble([model, model]))


def test_sampling_cli_seed_and_flag_errors(capsys: pytest.CaptureFixture, checkpoint: Path) -> None:
    ck = str(checkpoint)
    args = ("-c", ck, "--sampling", "--nbest", "3", "--seed", "5", *SOURCES[:2])
    first, second = call_main(capsys, *args), call_main(capsys, *args)
    assert first[0] == 0 and first[1] == second[1]
    assert len(first[1].splitlines()) == 6  # 3 samples per sentence, n-best format
    for flags, words in [
        (("--topk", "3"), "--topk applies to sampling only"),
        (("--temperature", "0.5"), "add --sampling"),
        (("--sampling", "--topp", "1.5"), "topp must be in (0, 1]"),
    ]:
        status, _, err = call_main(capsys, "-c", ck, *flags, "x")
        assert status == 1
        assert_one_line_error(err, words)
    status, _, err = call_main(capsys, "-c", ck, "--sampling", "--temperature", "0", "x")
    assert status == 1
    assert_one_line_error(err, "temperature must be > 0")


# -------------------------------------------------------------------------------- prefix


@pytest.mark.parametrize(
    "cfg",
    [SearchConfig(beam_size=1), SearchConfig(beam_size=3, nbest=3), SearchConfig(sampling=True)],
    ids=["greedy", "beam", "sampling"],
)
def test_prefix_is_forced_and_scores_agree(model, tokenizer, cfg: SearchConfig) -> None:  # noqa: ANN001
    """Every hypothesis starts with its sentence's prefix subwords (prefixes of different
    lengths, one empty, in one batch), and --score of prefix + continuation gives the search's
    score."""
    prefixes = ["A man", "", "Two dogs play in the", "The", "A dog runs", "Two"]
    translator = Translator(model, tokenizer, cfg)
    nbest = translator.translate_nbest(SOURCES, prefixes=prefixes)
    src_ids = tokenizer.encode_src(SOURCES)
    for hyps, prefix, src in zip(nbest, tokenizer.encode_tgt(prefixes), src_ids, strict=True):
        for hyp in hyps:
            assert hyp.tokens[: len(prefix)] == prefix
            scored = translator.score_ids([src], [hyp.tokens])[0]
            assert scored.score == pytest.approx(hyp.score, abs=1e-4)


def test_greedy_prefix_of_the_greedy_output_changes_nothing(model, tokenizer) -> None:  # noqa: ANN001
    """Forcing the first k subwords greedy chose anyway gives the same translation and score."""
    cfg = SearchConfig(beam_size=1)
    src = encode_source_batch(tokenizer.encode_src(SOURCES), tokenizer.special)
    free = greedy_search(model, src, tokenizer.special, cfg).hypotheses
    width = max(len(nbest[0].tokens) for nbest in free)
    rows = [nbest[0].tokens[:2] + [-1] * (width - min(2, len(nbest[0].tokens))) for nbest in free]
    forced = greedy_search(model, src, tokenizer.special, cfg, torch.tensor(rows)).hypotheses
    for a, b in zip(free, forced, strict=True):
        assert a[0].tokens == b[0].tokens
        assert a[0].score == pytest.approx(b[0].score, abs=1e-5)


def test_prefix_longer_than_the_budget_still_fits(model, tokenizer) -> None:  # noqa: ANN001
    cfg = SearchConfig(beam_size=2, max_len_a=0.0, max_len_b=1)
    prefix = "Two dogs play in the park"
    hyp = Translator(model, tokenizer, cfg).translate_nbest([SOURCES[0]], prefixes=[prefix])[0][0]
    assert hyp.tokens == tokenizer.encode_tgt([prefix])[0]  # the prefix, then EOS


def test_prefix_cli_file_and_tab_forms_agree(
    capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path
) -> None:
    prefixes = ["A man", "", "Two dogs"]
    (tmp_path / "src").write_text("\n".join(SOURCES[:3]) + "\n")
    (tmp_path / "prefix").write_text("\n".join(prefixes) + "\n")
    ck = str(checkpoint)
    args = ("-c", ck, "--beam", "3", "--input", str(tmp_path / "src"))
    status, from_file, err = call_main(capsys, *args, "--prefix", str(tmp_path / "prefix"))
    assert status == 0, err
    lines = from_file.splitlines()
    assert lines[0].startswith("A man") and lines[2].startswith("Two dogs")
    pairs = zip(SOURCES[:3], prefixes, strict=True)
    tab_input = "".join(f"{s}\t{p}\n" if p else f"{s}\n" for s, p in pairs)
    piped = run_cli("-c", ck, "--beam", "3", "--tab-prefix", stdin=tab_input)
    assert piped.returncode == 0 and piped.stdout.decode() == from_file
    (tmp_path / "short").write_text("A man\n")
    for flags, words in [
        (("--prefix", str(tmp_path / "short")), "has 1 lines but the input has 3"),
        (("--prefix", str(tmp_path / "prefix"), "--tab-prefix"), "keep one"),
    ]:
        status, _, err = call_main(capsys, *args, *flags)
        assert status == 1
        assert_one_line_error(err, words)


# ----------------------------------------------------------------------------- alignment


def test_word_ids_and_word_alignment_merge_subwords() -> None:
    """Pieces -> words by "▁"; a target word aligns to the source word whose pieces get the
    most attention, averaged over the target word's pieces; EOS row and column ignored."""
    src = ["▁Ein", "▁Fahr", "rad", "."]  # words: Ein | Fahrrad.
    tgt = ["▁A", "▁bi", "ke", "."]  # words: A | bike.
    assert word_ids(src) == [0, 1, 1, 1] and word_ids(["ab", "▁c"]) == [0, 1]
    cross = torch.tensor(
        [  # columns: Ein Fahr rad . </s>
            [0.7, 0.1, 0.1, 0.0, 0.1],  # A -> Ein
            [0.4, 0.3, 0.3, 0.0, 0.0],  # bi: Fahrrad. (0.6) > Ein (0.4)
            [0.5, 0.2, 0.2, 0.1, 0.0],  # ke: alone Ein would win...
            [0.5, 0.3, 0.2, 0.0, 0.0],  # ...but bike. sums to Fahrrad. 1.5 > Ein 1.4
            [0.0, 0.0, 0.0, 0.0, 9.0],  # the EOS step: ignored
        ]
    )
    alignment = word_alignment(cross, src, tgt)
    assert alignment == [(0, 0), (1, 1)]
    assert format_alignment(alignment) == "0-0 1-1"


def test_alignment_uses_the_chosen_layer_of_the_search_attention(model, tokenizer) -> None:  # noqa: ANN001
    """`Translator.align` in a batch equals the alignment from one sentence's attention maps
    (the chosen layer, mean over heads), and aligns every target word once."""
    translator = Translator(model, tokenizer, SearchConfig(beam_size=2))
    special = tokenizer.special
    src_ids = tokenizer.encode_src(SOURCES)
    hyps = [nbest[0].tokens for nbest in translator.search_ids(src_ids)]
    for layer, index in ((None, 0), (0, 0), (-1, 1)):  # the tiny model has 2 decoder layers
        batched = translator.align(src_ids, hyps, layer)
        for src, hyp, got in zip(src_ids, hyps, batched, strict=True):
            src_t = encode_source_batch([src], special)
            maps = model.attention_maps(src_t, torch.tensor([[special.bos, *hyp]]))
            src_pieces, tgt_pieces = tokenizer.src_pieces(src), tokenizer.tgt_pieces(hyp)
            one = word_alignment(maps.cross[index][0].mean(dim=0), src_pieces, tgt_pieces)
            assert got == one
            assert [j for _, j in got] == list(range(word_ids(tgt_pieces)[-1] + 1))
            assert all(0 <= i <= word_ids(src_pieces)[-1] for i, _ in got)


def test_print_alignment_cli_format(capsys: pytest.CaptureFixture, checkpoint: Path) -> None:
    ck = str(checkpoint)
    status, out, err = call_main(capsys, "-c", ck, "--print-alignment", SOURCES[0], "", SOURCES[1])
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1] == " ||| "
    text, pairs = lines[0].split(" ||| ")
    targets = [int(p.split("-")[1]) for p in pairs.split()]
    assert targets == list(range(len(text.split())))  # one pair per output word
    status, out, _ = call_main(capsys, "-c", ck, "--print-alignment", "--nbest", "2", SOURCES[0])
    assert status == 0 and all(len(line.split(" ||| ")) == 4 for line in out.splitlines())
    status, _, err = call_main(capsys, "-c", ck, "--print-alignment", "--alignment-layer", "7", "x")
    assert status == 1
    assert_one_line_error(err, "--alignment-layer", "decoder has 2")


def test_search_config_sampling_fields_are_flags_and_validated() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["-c", "x", "--sampling", "--topk", "3", "--topp", "0.5"])
    cfg = cli.search_from_flags(args)
    assert (cfg.sampling, cfg.topk, cfg.topp, cfg.temperature, cfg.seed) == (True, 3, 0.5, 1.0, 1)
    assert SearchConfig(sampling=True, nbest=8, beam_size=1).nbest == 8  # samples, not beams
    with pytest.raises(ValueError, match="temperature"):
        SearchConfig(temperature=0.0)
