"""Smoke tests of the benchmark harness and each of its plug-ins (tiny sizes, one thread).

No timing assertion: they check that the harness runs, reports positive numbers, writes the
expected JSON, and that the peers and the no-cache baseline compute what ours computes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import beam_search, greedy_search
from attnmt.decoding.translator import length_sorted_batches
from attnmt.decoding.uncached import UncachedModel
from benchmarks import benchmark, harness
from tests.helpers_decoding import (
    PAIRS,
    SEARCH_MODEL,
    SPECIAL,
    random_sources,
    single_thread,
    tiny_tokenizer,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def run(plugin: ModuleType, flags: list[str]) -> dict:
    """The plug-in's report, as the harness parses its flags."""
    args = harness.parser(plugin).parse_args(flags)
    args.device = args.device or "cpu"
    return plugin.run(args)


@pytest.mark.parametrize("beam", [1, 4])
def test_no_cache_model_gives_the_cached_tokens(beam: int, tiny_model) -> None:  # noqa: ANN001
    tiny = tiny_model(seed=3, **SEARCH_MODEL)
    src_ids = random_sources([4, 12, 7, 2], seed=9)
    search = greedy_search if beam == 1 else beam_search
    cfg = SearchConfig(beam_size=beam, nbest=beam)
    cached = search(tiny, src_ids, SPECIAL, cfg).hypotheses
    uncached = search(UncachedModel(tiny), src_ids, SPECIAL, cfg).hypotheses
    assert [[h.tokens for h in nbest] for nbest in uncached] == [
        [h.tokens for h in nbest] for nbest in cached
    ]
    assert any(len(nbest[0].tokens) > 1 for nbest in cached)  # not a trivial output


# ------------------------------------------------------------- real sentences (--run)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tiny model trained on the 40 toy pairs (outputs end in EOS by themselves), saved as a
    train.py run dir, with real sources and references: (run dir, src file, ref file)."""
    from tests.test_export import TOY, save_run, train_tiny

    tmp = tmp_path_factory.mktemp("bench_run")
    tokenizer = tiny_tokenizer(tmp / "spm")
    save_run(tmp / "run", train_tiny(tokenizer, steps=120), tokenizer)
    src, ref = tmp / "src.de", tmp / "ref.en"
    src.write_text("".join(f"{s}\n" for s, _ in PAIRS[:12]) + (TOY / "test.de").read_text())
    ref.write_text("".join(f"{t}\n" for _, t in PAIRS[:12]) + (TOY / "test.en").read_text())
    return tmp / "run", src, ref


def real_flags(trained_run: tuple[Path, Path, Path], *extra: str) -> list[str]:
    run, src, ref = trained_run
    files = ["--run", str(run), "--src", str(src), "--ref", str(ref)]
    return [*files, *"--threads 1 --repeats 2 --decode-batch 8 --beams 1,3".split(), *extra]


def test_real_mode_table_with_peers_and_ratios(
    trained_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (.[export] extra)")
    pytest.importorskip("transformers", reason="transformers is not installed (.[bench] extra)")
    path = tmp_path / "real.json"
    with single_thread():
        status = harness.main(benchmark, real_flags(trained_run, "--json", str(path)))
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads(path.read_text())
    systems = report["systems"]
    names = ["attnmt", "attnmt int8", "transformers", "CTranslate2 fp32", "CTranslate2 int8"]
    assert list(systems) == names
    n = report["meta"]["sentences"]
    assert n == 24
    for name in names:
        for search in ("greedy", "beam 3"):
            cell = systems[name][search]
            assert len(cell["times_s"]) == 2
            rate = cell["sentences_per_s"]
            assert 0 < rate["min"] <= rate["median"] <= rate["max"]
            ratio = cell["ratio_attnmt_over_system"]
            assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
            assert 0 <= cell["bleu"] <= 100
    # fp32 peers on our weights: mostly our greedy ids (exactly where ours stopped before its
    # budget: test_peers_give_our_greedy_ids), not a trivial output.
    for name in ("transformers", "CTranslate2 fp32"):
        assert systems[name]["greedy"]["same_ids_as_ours"] >= n // 2
    assert systems["attnmt"]["greedy"]["tokens_per_sentence"] > 2
    assert systems["attnmt"]["greedy"]["bleu"] > 10  # it learned the training pairs
    # One Markdown table: a row per system, sent/s, BLEU and ratio columns per search.
    head = next(line for line in out.splitlines() if line.startswith("| system"))
    columns = ["greedy sent/s", "beam 3 sent/s", "greedy BLEU", "beam 3 BLEU"]
    columns += ["attnmt / system, greedy", "attnmt / system, beam 3"]
    for column in columns:
        assert column in head
    rows = [line for line in out.splitlines() if line.startswith("| ") and "system" not in line]
    assert [row.split(" | ")[0][2:] for row in rows] == names
    assert all(row.count("x (") == 2 for row in rows[1:])  # ratio (min-max) per search
    assert report["meta"]["code"] in out  # the tree timed and its commit, for A/Bs


def test_the_code_under_test_names_its_tree_and_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    root = Path(harness.ROOT)
    where, _, commit = harness.code_under_test().partition(" at ")
    assert Path(where) == root
    if (root / ".git").exists():  # a checkout (CI's clone is one): the commit is HEAD's
        git = ["git", "-C", str(root), "rev-parse", commit.removesuffix("-dirty"), "HEAD"]
        named, head = subprocess.run(git, capture_output=True, text=True, check=True).stdout.split()
        assert named == head

    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(harness.subprocess, "run", no_git)
    assert harness.code_under_test() == f"{root} (not a git checkout)"


def test_real_mode_bf16_and_the_unpacked_engine(
    trained_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--precision bf16 decodes ours' float systems under bf16 autocast, as translate.py
    --precision bf16 does (the engine's bf16 copies made where they run), and --unpacked
    times ours once more with the engine's packed paths off, on the same sentences."""
    from attnmt.checkpoint import load_for_inference
    from attnmt.engine import Engine
    from benchmarks import peers

    path = tmp_path / "bf16.json"
    flags = ["--peers", "", "--beams", "1", "--precision", "bf16", "--unpacked"]
    with single_thread():
        status = harness.main(benchmark, real_flags(trained_run, *flags, "--json", str(path)))
    assert status == 0, capsys.readouterr().out
    report = json.loads(path.read_text())
    assert list(report["systems"]) == ["attnmt", "attnmt int8", "attnmt unpacked"]
    assert report["meta"]["precision"] == "bf16" and report["meta"]["unpacked"]
    n = report["meta"]["sentences"]
    assert report["systems"]["attnmt unpacked"]["greedy"]["same_ids_as_ours"] >= n - 2
    run, src, _ = trained_run
    model, tokenizer, _ = load_for_inference(run / "checkpoints" / "best.pt")
    engine = Engine(model)
    src_ids = tokenizer.encode_src(src.read_text().splitlines())
    cfg = SearchConfig(beam_size=1, batch_size=8)
    with single_thread():
        got = peers.ours_system(engine, tokenizer, precision="bf16")(src_ids, cfg)
        made = getattr(engine.generator, "bf16", None) is not None  # by a bf16 search only
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = peers.ours_system(engine, tokenizer)(src_ids, cfg)
    assert got == want
    assert made == engine.pack_bf16


def test_peers_give_our_greedy_ids(trained_run: tuple[Path, Path, Path]) -> None:
    """transformers and CTranslate2 fp32 on our weights, searching ours' batches with the
    batch's largest budget: our greedy ids on every sentence that ours ended with EOS before
    its own budget (the others run on to the batch's budget)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (.[export] extra)")
    pytest.importorskip("transformers", reason="transformers is not installed (.[bench] extra)")
    from attnmt.checkpoint import load_for_inference
    from attnmt.engine import Engine
    from attnmt.exporting.ct2 import export_ct2
    from attnmt.exporting.shared import budgets
    from benchmarks import peers

    run, src, _ = trained_run
    model, tokenizer, _ = load_for_inference(run / "checkpoints" / "best.pt")
    src_ids = tokenizer.encode_src(src.read_text().splitlines())
    cfg = SearchConfig(beam_size=1, batch_size=8)
    with single_thread(), tempfile.TemporaryDirectory() as tmp:
        export_ct2(model, tokenizer, Path(tmp), "float32")
        ct2 = peers.ct2_system(Path(tmp), tokenizer, threads=1)(src_ids, cfg)
        hf = peers.transformers_system(model, tokenizer)(src_ids, cfg)
        engine = Engine(model)  # what translate.py searches with
        ours = peers.ours_system(engine, tokenizer)(src_ids, cfg)
        # two batches at once (benchmark.py --inter-threads 2, batch by batch, where one at a
        # time is continuous batching): the same ids, in input order
        assert peers.ours_system(engine, tokenizer, inter_threads=2)(src_ids, cfg) == ours
        with pytest.MonkeyPatch.context() as patch:  # the CTranslate2 side builds no model
            patch.setattr("attnmt.checkpoint.build_model", pytest.fail)
            ct2_inter = peers.ct2_from_folder(tmp, str(run / "checkpoints" / "best.pt"), 2, 2)
        assert ct2_inter(src_ids, cfg) == ct2
    assert len(length_sorted_batches(src_ids, cfg.batch_size)) > 2
    limits = budgets(src_ids, tokenizer.special, cfg)
    ended = [
        i for i, (ids, budget) in enumerate(zip(ours, limits, strict=True)) if len(ids) < budget
    ]
    assert len(ended) >= len(src_ids) // 2
    assert [ct2[i] for i in ended] == [ours[i] for i in ended]
    assert [hf[i] for i in ended] == [ours[i] for i in ended]


def test_real_mode_without_ctranslate2_says_why(
    trained_run: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if not installed
    with single_thread():
        report = run(benchmark, real_flags(trained_run, "--peers", "ctranslate2", "--beams", "1"))
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "ctranslate2" in line and "skipped" in line]
    assert len(notes) == 1 and "not installed" in notes[0]
    assert list(report["systems"]) == ["attnmt", "attnmt int8"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "nowhere"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--beams", "0"], "--beams must be beam sizes >= 1"),
        (["--cpu-kinds", "avx9"], "--cpu-kinds takes native, avx2"),
        (["--peers", "marian"], "unknown peer(s) ['marian']"),
    ],
)
def test_bad_input_is_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert harness.main(benchmark, ["--run", "nowhere", "--src", "x.txt", *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmark.py: error: ") and message in err and "\n" not in err


def test_isolated_systems_run_in_their_own_processes(trained_run: tuple[Path, Path, Path]) -> None:
    """`peers.compare` with `Isolated` systems: each search runs in a worker process (not
    this one), returns the in-process ids, and the workers are gone afterwards; a system
    that fails to build gives its message as a UserError."""
    import multiprocessing

    from attnmt.engine import load_engine
    from benchmarks import peers

    run, src, _ = trained_run
    path = str(run / "checkpoints" / "best.pt")
    model, tokenizer = load_engine([path])
    src_ids = tokenizer.encode_src(src.read_text().splitlines())
    cfg = SearchConfig(beam_size=2, batch_size=8)
    with single_thread():
        want = peers.ours_system(model, tokenizer)(src_ids, cfg)
        isolated = peers.Isolated(peers.ours_from_checkpoint, (path, "none"), threads=1)
        cells = peers.compare({"ours": isolated}, src_ids, [cfg], repeats=2)
    assert cells[("ours", 2)].ids == want
    assert len(cells[("ours", 2)].times_s) == 2 and all(cells[("ours", 2)].times_s)
    assert not multiprocessing.active_children()
    broken = peers.Isolated(peers.ours_from_checkpoint, (str(run / "missing.pt"), "none"), 1)
    with pytest.raises(UserError, match="missing.pt"):
        peers.compare({"ours": broken}, src_ids, [cfg], repeats=1)
    assert not multiprocessing.active_children()


def echo_env(name: str) -> Callable:
    """A `peers.Isolated` builder: a search that answers each sentence with the characters
    of the worker's environment variable `name` (for the test below)."""
    import os

    value = [ord(c) for c in os.environ.get(name, "")]
    return lambda src_ids, cfg: [value for _ in src_ids]


def test_isolated_env_reaches_the_worker_only() -> None:
    import os

    from benchmarks import peers

    name = "ATTNMT_TEST_KIND"
    assert name not in os.environ
    spec = peers.Isolated(echo_env, (name,), 1, ((name, "avx2"),))
    cells = peers.compare(
        {"echo": spec}, [[5]], [SearchConfig(beam_size=1, batch_size=1)], repeats=1
    )
    assert cells[("echo", 1)].ids == [[ord(c) for c in "avx2"]]
    assert name not in os.environ  # the parent's environment is as it was


def test_real_mode_runs_every_system_on_every_cpu_kind(
    trained_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (.[export] extra)")
    path = tmp_path / "kinds.json"
    flags = ["--peers", "ctranslate2", "--cpu-kinds", "native,avx2", "--json", str(path)]
    with single_thread():
        status = harness.main(benchmark, real_flags(trained_run, *flags))
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads(path.read_text())
    names = ["attnmt", "attnmt int8", "attnmt [avx2]", "attnmt int8 [avx2]"]
    names += ["CTranslate2 fp32", "CTranslate2 fp32 [avx2]"]
    names += ["CTranslate2 int8", "CTranslate2 int8 [avx2]"]
    assert list(report["systems"]) == names
    avx2 = report["cpu_kinds"]["avx2"]  # the same cells, ratios against ours on AVX2
    assert list(avx2) == names
    for search in ("greedy", "beam 3"):
        assert avx2["attnmt [avx2]"][search]["ratio_attnmt [avx2]_over_system"]["median"] == 1
        # float32 on another instruction set: rounding may differ, the outputs hardly
        assert avx2["attnmt"][search]["same_ids_as_ours"] >= 12
    assert "CPU kind avx2: ours under ATEN_CPU_CAPABILITY=avx2" in out
    assert "attnmt int8 [avx2] / CTranslate2 int8 [avx2], greedy" in out


def test_several_runs_with_their_own_tokenizers_in_one_table(
    trained_run: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A student (its own SentencePiece model, one decoder layer) timed against its teacher:
    each run's sentences encoded and its outputs decoded with its own tokenizer, every ratio
    against the first run's ours."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (.[export] extra)")
    from attnmt.checkpoint import load_for_inference
    from attnmt.engine import Engine
    from attnmt.evaluation.bleu import corpus_bleu
    from benchmarks import peers
    from tests.test_export import save_run, train_tiny

    run, src, ref = trained_run
    tokenizer = tiny_tokenizer(tmp_path / "spm", vocab_size=70)
    save_run(tmp_path / "student", train_tiny(tokenizer, 120, n_decoder_layers=1), tokenizer)
    path = tmp_path / "two.json"
    flags = real_flags(trained_run, "--peers", "ctranslate2", "--json", str(path))
    with single_thread():
        status = harness.main(benchmark, ["--run", str(tmp_path / "student"), *flags])
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads(path.read_text())
    names = ["attnmt", "attnmt int8", "CTranslate2 fp32", "CTranslate2 int8"]
    names += [f"{name} (run)" for name in names]
    assert list(report["systems"]) == names
    assert list(report["meta"]["runs"]) == ["", "run"]
    for label, folder in (("", tmp_path / "student"), (" (run)", run)):
        model, tok, _ = load_for_inference(folder / "checkpoints" / "best.pt")
        lines = src.read_text().splitlines()
        cfg = SearchConfig(beam_size=3, batch_size=8)
        with single_thread():
            ids = peers.ours_system(Engine(model), tok)(tok.encode_src(lines), cfg)
        bleu = corpus_bleu(tok.decode_tgt(ids), ref.read_text().splitlines()).score
        assert report["systems"][f"attnmt{label}"]["beam 3"]["bleu"] == pytest.approx(bleu)
        ratio = report["systems"][f"attnmt{label}"]["greedy"]["ratio_attnmt_over_system"]
        assert (ratio["median"] == 1) == (label == "")
    assert "attnmt int8 / CTranslate2 int8 (run), greedy" in out
    # ids are compared with ours only within one tokenizer's vocabulary
    assert report["systems"]["CTranslate2 fp32"]["greedy"]["same_ids_as_ours"] >= 12
    assert report["systems"]["attnmt (run)"]["greedy"]["same_ids_as_ours"] is None


# ------------------------------------------------- fine-tuning an import (benchmarks/finetune.py)


def test_finetune_benchmark_trains_both_on_the_same_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """benchmarks/finetune.py at the import tests' NARROW widths on the toy corpus (CPU, bf16):
    the first batch's NLL agrees (fp32 exactly, bf16 within its tolerance), both systems train
    on the same tokens, and the JSON holds what the table prints."""
    pytest.importorskip("transformers", reason="transformers is not installed (.[export] extra)")
    from benchmarks import finetune

    toy = Path(__file__).parent / "fixtures" / "toy"
    path = tmp_path / "finetune.json"
    flags = ["--tiny", "--layers", "1", "--vocab", "200", "--device", "cpu", "--batch-tokens",
             "128", "--updates", "4", "--warmup", "1", "--src", str(toy / "train.en"),
             "--tgt", str(toy / "train.de"), "--json", str(path)]  # fmt: skip
    assert harness.main(finetune, flags) == 0
    assert "ratio ours/transformers (tokens/s)" in capsys.readouterr().out
    report = json.loads(path.read_text())
    assert set(report["check"]) == {"fp32", "bf16"}
    assert all(check["passed"] for check in report["check"].values())
    assert report["check"]["fp32"]["rel_diff"] < 1e-4
    ours, theirs = report["results"]["ours"], report["results"]["transformers"]
    assert ours["tokens"] == theirs["tokens"] > 0
    for r in (ours, theirs):
        assert r["tokens_per_s"] > 0 and r["ms_median"] > 0 and r["peak_bytes"] is None
        assert len(r["losses"]) == len(r["ms"]) == 4 and len(r["rounds"]) == 2
        assert all(0 < loss < 20 for loss in r["losses"])
    assert report["meta"]["params"]["ours"] == report["meta"]["params"]["transformers"]
    assert report["meta"]["ema_decay"] == 0  # the same work: no weight average on either side
    assert len(report["ratio"]["per_round"]) == 2 and report["ratio"]["ours/transformers"] > 0


# ------------------------------------------------- the training step (benchmarks/train_step.py)


def test_train_step_report_times_train_pys_update_without_host_reads(tmp_path: Path) -> None:
    """benchmarks/train_step.py on the CPU: train.py's update (eager, bf16) on rotating batch
    shapes reads nothing back to the host, the operators' time lies within the profiled time,
    and tokens/s is the timed tokens over the timed time."""
    from benchmarks import train_step

    path = tmp_path / "step.json"
    flags = ["--device", "cpu", "--presets", "tiny", "--variants", "bf16", "--vocab", "300",
             "--batch-tokens", "256", "--max-lens", "6,9", "--cycles", "2",
             "--profile-updates", "2", "--json", str(path)]  # fmt: skip
    assert harness.main(train_step, flags) == 0
    report = json.loads(path.read_text())
    (entry,) = report["entries"]
    assert (entry["preset"], entry["variant"]) == ("tiny", "bf16")
    assert entry["syncs_per_update"] == 0  # tests/host_reads.py's count, eager
    assert 0 < entry["kernel_ms_per_update"] <= entry["profiled_ms_per_update"]  # a union
    assert entry["busy"] == entry["kernel_ms_per_update"] / entry["ms_per_update"]
    assert entry["kernels_per_update"] > 0
    assert entry["mfu"] is None and entry["peak_memory_gib"] is None  # GPU only
    per_update = entry["tokens_per_update"] / (entry["ms_per_update"] / 1e3)
    assert entry["tokens_per_s"] == pytest.approx(per_update)
    low, high = entry["ms_per_update_range"]
    assert low <= entry["ms_per_update"] <= high
    assert entry["flops_per_update"] > 6 * entry["params"] * 0.5  # at least a token's worth
