"""translate.py end to end on a tiny random model + tiny SentencePiece model, and Translator.

Subprocesses cost ~2-3 s each (imports), so each one checks several things; error cases that
stop before the model is loaded, or that need no fresh process, call `translate.main` directly.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import translate
from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.cli import translate as cli
from attnmt.common import runtime
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.ensemble import Ensemble
from attnmt.decoding.plot import heatmap_image, heatmap_tensor
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from tests.helpers_decoding import PAIRS, SEARCH_MODEL, single_thread, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # tiny ops: 1 thread

INPUTS = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Park.", "Die Sonne scheint."]
LONG = " ".join(src for src, _ in PAIRS for _ in range(3)).split()[:500]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


@pytest.fixture(scope="session")
def model_b(tokenizer: Tokenizer, tiny_model) -> torch.nn.Module:  # noqa: ANN001
    """A second model for ensembles: same tokenizer, another size (wider, deeper decoder)."""
    vocab = tokenizer.src_vocab_size
    return tiny_model(
        vocab_size=vocab, seed=5, d_model=48, d_ff=96, n_decoder_layers=3, **SEARCH_MODEL
    )


@pytest.fixture(scope="session")
def checkpoint_b(
    tmp_path_factory: pytest.TempPathFactory, model_b: torch.nn.Module, tokenizer: Tokenizer
) -> Path:
    path = tmp_path_factory.mktemp("run_b") / "b.pt"
    save_checkpoint(path, model_payload(model_b, tokenizer))
    return path


def run_cli(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), *args],
        input=data,
        capture_output=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )


def call_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    status = translate.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(err: str, *words: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("translate.py: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---------------------------------------------------------------- end to end (subprocesses)


def test_args_file_and_stdin_agree(checkpoint: Path, tmp_path: Path) -> None:
    """Args (batch 2) == --input file (batch 1, 2 inter-threads, --ref, --output) == stdin."""
    from_args = run_cli(
        "-c",
        str(checkpoint.parents[1]),
        "--beam",
        "3",
        "--batch-size",
        "2",
        "--plot-attention",
        str(tmp_path / "attn.png"),
        *INPUTS,
    )
    assert from_args.returncode == 0, from_args.stderr.decode()
    lines = from_args.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(INPUTS) and lines[1] == ""
    assert all(lines[i] for i in (0, 2, 3))
    assert (tmp_path / "attn.png").read_bytes().startswith(b"\x89PNG")

    (tmp_path / "in.de").write_text("\n".join(INPUTS) + "\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text(
        "A man rides a bike.\n\nTwo dogs.\nThe sun.\n", encoding="utf-8"
    )
    from_file = run_cli(
        "-c",
        str(checkpoint),
        "--beam",
        "3",
        "--input",
        str(tmp_path / "in.de"),
        "--ref",
        str(tmp_path / "ref.en"),
        "--output",
        str(tmp_path / "hyp.en"),
        "--batch-size",  # three batches, two searched at once: the same lines
        "1",
        "--inter-threads",
        "2",
    )
    assert from_file.returncode == 0, from_file.stderr.decode()
    assert from_file.stdout == b""
    assert (tmp_path / "hyp.en").read_bytes() == from_args.stdout
    err = from_file.stderr.decode()
    assert "BLEU = " in err and "chrF = " in err and "nrefs:1" in err and "tok:13a" in err

    from_stdin = run_cli("-c", str(checkpoint), "--beam", "3", stdin="\n".join(INPUTS))
    assert from_stdin.returncode == 0, from_stdin.stderr.decode()
    assert from_stdin.stdout == from_args.stdout


def test_very_long_line_gives_a_line(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, checkpoint: Path
) -> None:
    """500 words (~1900 pieces: past the 1024 precomputed positions) between short lines."""
    text = "Ein Hund.\n" + " ".join(LONG) + "\n\nDie Sonne scheint.\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    args = ("-c", str(checkpoint), "--beam", "2", "--max-len-a", "0.02", "--max-len-b", "5")
    status, out, err = call_main(capsys, *args)
    assert status == 0, err
    lines = out.split("\n")
    assert len(lines) == 5 and lines[1] and lines[2] == "" and lines[4] == ""


def test_ref_line_count_mismatch_is_one_line(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "ref.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    result = run_cli("-c", str(checkpoint), "--ref", str(tmp_path / "ref.en"), "a", "b")
    assert result.returncode != 0
    assert_one_line_error(result.stderr.decode(), "3 lines", "has 2")


class RunsCode:
    """Unpickling this would run a shell command (creating a file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_that_would_run_code_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = torch.load(checkpoint, weights_only=True)
    payload["model_config"] = RunsCode(marker)
    evil = tmp_path / "evil.pt"
    torch.save(payload, evil)
    result = run_cli("-c", str(evil), "Ein Mann.")
    assert result.returncode != 0
    assert_one_line_error(result.stderr.decode(), "refusing", str(evil))
    assert not marker.exists()


# ----------------------------------------------------------------- errors (in process)


class Custom:
    """Any non-allow-listed class makes a checkpoint unloadable with weights_only=True."""


def test_checkpoint_errors(capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path) -> None:
    status, _, err = call_main(capsys, "-c", str(tmp_path / "nope.pt"), "Hallo")
    assert status != 0
    assert_one_line_error(err, "not found", "nope.pt")

    custom = tmp_path / "custom.pt"
    torch.save({**torch.load(checkpoint, weights_only=True), "extra": Custom()}, custom)
    status, _, err = call_main(capsys, "-c", str(custom), "Hallo")
    assert status != 0
    assert_one_line_error(err, "refusing")

    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    status, _, err = call_main(capsys, "-c", str(tmp_path / "garbage.pt"), "Hallo")
    assert status != 0
    assert_one_line_error(err, "garbage.pt")


def test_input_and_output_errors(
    capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path
) -> None:
    ckpt = str(checkpoint)
    status, _, err = call_main(capsys, "-c", ckpt, "--input", str(tmp_path / "missing.de"))
    assert status != 0
    assert_one_line_error(err, "not found", "missing.de")

    bad = tmp_path / "latin1.de"
    bad.write_bytes("Guten Tag\nGrüße\n".encode("latin-1"))
    status, _, err = call_main(capsys, "-c", ckpt, "--input", str(bad))
    assert status != 0
    assert_one_line_error(err, "latin1.de", "UTF-8", "line 2")

    status, _, err = call_main(capsys, "-c", ckpt, "--output", str(tmp_path / "no" / "hyp.en"), "a")
    assert status != 0
    assert_one_line_error(err, "does not exist", str(tmp_path / "no"))

    with pytest.MonkeyPatch.context() as patch:  # tests may run as root: fake a read-only dir
        patch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
        status, _, err = call_main(capsys, "-c", ckpt, "--output", str(tmp_path / "hyp.en"), "a")
    assert status != 0
    assert_one_line_error(err, "not writable", str(tmp_path))

    status, _, err = call_main(capsys, "-c", ckpt, "--beam", "2", "--nbest", "3", "a")
    assert status != 0
    assert_one_line_error(err, "--nbest 3", "--beam")

    for flag in ("--beam", "--inter-threads"):
        with pytest.raises(SystemExit) as exit_info:
            translate.main(["-c", ckpt, flag, "0", "a"])
        assert exit_info.value.code == 2
        assert_one_line_error(capsys.readouterr().err, flag, "less than 1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu(capsys: pytest.CaptureFixture, checkpoint: Path) -> None:
    status, _, err = call_main(capsys, "-c", str(checkpoint), "--device", "cuda", "a")
    assert status != 0
    assert_one_line_error(err, "--device cuda", "--device cpu")


def test_cpu_translation_keeps_freed_memory(
    capsys: pytest.CaptureFixture, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """translate.py on the CPU sets glibc's malloc to reuse freed blocks (`common.memory`)
    before it loads the model; the setting is process-wide, so here it is only recorded."""
    import attnmt.common.memory as memory

    calls: list[str] = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: calls.append("kept") or True)
    status, out, err = call_main(capsys, "-c", str(checkpoint), "--device", "cpu", "Ein Hund.")
    assert status == 0, err
    assert calls == ["kept"] and len(out.splitlines()) == 1


def test_nbest_output_format(capsys: pytest.CaptureFixture, checkpoint: Path) -> None:
    status, out, err = call_main(
        capsys, "-c", str(checkpoint), "--beam", "3", "--nbest", "2", "Ein Hund.", ""
    )
    assert status == 0, err
    lines = out.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1"]
    first, second = (float(line.split(" ||| ")[2]) for line in lines[:2])
    assert first >= second


def test_precision_bf16_runs_and_fp32_is_unchanged(
    capsys: pytest.CaptureFixture,
    checkpoint: Path,
    model,
    tokenizer,  # noqa: ANN001
) -> None:
    expected = Translator(model, tokenizer, SearchConfig(beam_size=2)).translate(INPUTS)
    args = ("-c", str(checkpoint), "--beam", "2", *INPUTS)
    for extra in ((), ("--precision", "fp32")):
        status, out, err = call_main(capsys, *args, *extra)
        assert status == 0, err
        assert out.split("\n")[:-1] == expected
    status, out, err = call_main(capsys, *args, "--precision", "bf16")
    assert status == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == len(INPUTS) and lines[1] == ""


def test_unsupported_precision_is_one_line(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, checkpoint: Path
) -> None:
    monkeypatch.setattr(runtime, "autocast_supported", lambda device_type, dtype: False)
    status, _, err = call_main(capsys, "-c", str(checkpoint), "--precision", "fp16", "a")
    assert status != 0
    assert_one_line_error(err, "--precision fp16", "--precision fp32")


@pytest.mark.parametrize(
    ("flags", "named", "fix"),
    [
        (["--pack", "generator,decoders"], "unknown decoders", "use auto, off, all"),
        (["--pack", "all", "--quantize", "int8"], "--pack all", "drop --pack"),
    ],
)
def test_bad_pack_is_one_line(
    capsys: pytest.CaptureFixture, checkpoint: Path, flags: list[str], named: str, fix: str
) -> None:
    status, out, err = call_main(capsys, "-c", str(checkpoint), *flags, "a")
    assert status != 0 and out == ""
    assert_one_line_error(err, named, fix)


def test_forced_packing_gives_the_same_translations(
    capsys: pytest.CaptureFixture, checkpoint: Path
) -> None:
    """--pack off and --pack all (every group packed: searches on the one-token step) translate
    as the timed choice does."""
    outs = []
    for pack in ("auto", "off", "all"):
        status, out, err = call_main(capsys, "-c", str(checkpoint), "--pack", pack, *INPUTS)
        assert status == 0, err
        outs.append(out)
    assert outs[0] == outs[1] == outs[2] and outs[0].strip()


def test_search_flags_follow_search_config(capsys: pytest.CaptureFixture) -> None:
    """Every SearchConfig field is a flag with the dataclass's default; --lp-type reaches it."""
    args = cli.build_parser().parse_args(["-c", "x"])
    assert cli.search_from_flags(args) == SearchConfig()
    args = cli.build_parser().parse_args(["-c", "x", "--lp-type", "gnmt", "--beam", "3"])
    assert cli.search_from_flags(args) == SearchConfig(lp_type="gnmt", beam_size=3)
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["-c", "x", "--lp-type", "nope", "a"])
    assert exit_info.value.code == 2
    assert_one_line_error(capsys.readouterr().err, "--lp-type")


# ------------------------------------------------------------------------------ Translator


def test_translator_order_empty_lines_and_training_mode(model, tokenizer) -> None:  # noqa: ANN001
    sentences = ["Die Sonne scheint.", "", "Ein Mann spielt Gitarre im Park.", "  ", "Es regnet."]
    big = Translator(model, tokenizer, SearchConfig(beam_size=2, batch_size=64)).translate(
        sentences
    )
    one_by_one = [
        Translator(model, tokenizer, SearchConfig(beam_size=2)).translate([s])[0] for s in sentences
    ]
    assert big == one_by_one
    assert big[1] == "" and big[3] == ""
    model.train()
    small = Translator(model, tokenizer, SearchConfig(beam_size=2, batch_size=1)).translate(
        sentences
    )
    assert model.training, "the caller's mode is restored"
    model.eval()
    assert small == big


def test_greedy_translator_searches_with_continuous_batching(
    model,
    tokenizer,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Greedy search through `Translator` on an engine (one batch at a time) runs with
    continuous batching, with the n-best lists (scores to float rounding) of batch-by-batch
    search and progress counts that add up, empty sentences included."""
    sentences = ["Die Sonne scheint.", "", "Ein Mann spielt Gitarre.", "Es regnet."]
    sentences += ["Zwei Hunde laufen im Park.", "Eine Frau liest."]
    cfg = SearchConfig(beam_size=1, batch_size=2)
    calls: list[int] = []
    real = Engine.greedy_search_continuous

    def spy(self: Engine, src_ids: list, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(len(src_ids))
        return real(self, src_ids, *args, **kwargs)

    monkeypatch.setattr(Engine, "greedy_search_continuous", spy)
    engine = Engine(model)
    done: list[int] = []
    got = Translator(engine, tokenizer, cfg).translate_nbest(sentences, progress=done.append)
    assert calls == [5] and sum(done) == len(sentences) and len(done) > 2
    expected = Translator(model, tokenizer, cfg).translate_nbest(sentences)  # batch by batch
    assert calls == [5]  # a plain Transformer offers no continuous batching
    assert [[(h.text, h.tokens) for h in nbest] for nbest in got] == [
        [(h.text, h.tokens) for h in nbest] for nbest in expected
    ]
    got_scores = torch.tensor([nbest[0].score for nbest in got])
    expected_scores = torch.tensor([nbest[0].score for nbest in expected])
    torch.testing.assert_close(got_scores, expected_scores, atol=1e-4, rtol=0)
    assert len({h.text for nbest in got for h in nbest}) > 2  # not one degenerate output
    Translator(Engine(model, quantize="int8"), tokenizer, cfg).translate_nbest(sentences)
    assert calls == [5]  # int8 searches batch by batch: its scales are per batch


def test_inter_threads_search_batches_at_once_with_the_same_output(
    model,
    tokenizer,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Two batches in flight at once (a barrier that only two concurrent searches pass), each
    worker on half of torch's threads and under the caller's autocast; same n-best lists,
    progress counts and thread count afterwards as one batch at a time."""
    sentences = ["Die Sonne scheint.", "", "Ein Mann spielt Gitarre.", "Es regnet.", "Zwei Hunde."]
    cfg = SearchConfig(beam_size=2, nbest=2, batch_size=1)
    torch.set_num_threads(2)  # what each worker gets below (the sums' order depends on it)
    try:
        expected = Translator(model, tokenizer, cfg).translate_nbest(sentences)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected_bf16 = Translator(model, tokenizer, cfg).translate_nbest(sentences)
    finally:
        torch.set_num_threads(1)
    assert expected_bf16 != expected  # so the check below can tell whether autocast reached

    seen: list[tuple[int, int, bool]] = []  # (thread, torch threads, autocast) per batch
    barrier = threading.Barrier(2, timeout=30)
    search = Translator._search

    def spy(self: Translator, batch: list[list[int]], *args: object, **kwargs: object) -> list:
        seen.append(
            (threading.get_ident(), torch.get_num_threads(), torch.is_autocast_enabled("cpu"))
        )
        if len(seen) <= 2:
            barrier.wait()  # raises BrokenBarrierError unless two batches run concurrently
        return search(self, batch, *args, **kwargs)

    monkeypatch.setattr(Translator, "_search", spy)
    translator = Translator(model, tokenizer, cfg, inter_threads=2)
    torch.set_num_threads(4)
    try:
        done: list[int] = []
        assert translator.translate_nbest(sentences, progress=done.append) == expected
        assert sum(done) == len(sentences) and torch.get_num_threads() == 4
        threads_used = {thread for thread, _, _ in seen}
        assert len(threads_used) == 2 and threading.get_ident() not in threads_used
        assert {(threads, autocast) for _, threads, autocast in seen} == {(2, False)}
        seen.clear()
        barrier.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert translator.translate_nbest(sentences) == expected_bf16
        assert {autocast for _, _, autocast in seen} == {True}
    finally:
        torch.set_num_threads(1)
    with pytest.raises(ValueError, match="inter_threads"):
        Translator(model, tokenizer, cfg, inter_threads=0)


def test_attention_for_and_heatmap_image(model, tokenizer) -> None:  # noqa: ANN001
    translator = Translator(model, tokenizer, SearchConfig(beam_size=1))
    attn = translator.attention_for("Zwei Hunde spielen.")
    n_layers, n_heads = model.cfg.n_decoder_layers, model.cfg.n_heads
    assert attn.cross_attn.shape == (n_layers, n_heads, len(attn.tgt_pieces), len(attn.src_pieces))
    torch.testing.assert_close(attn.cross_attn.sum(-1), torch.ones(attn.cross_attn.shape[:-1]))
    assert attn.src_pieces[-1] == "</s>" and attn.tgt_pieces[-1] == "</s>"
    image = heatmap_image(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, title="t")
    assert image.dtype.name == "uint8" and image.ndim == 3 and image.shape[2] == 3
    grid = heatmap_tensor(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, layer=0, heads=True)
    assert grid.shape[0] == 3 and 0.0 <= grid.min() and grid.max() <= 1.0
    with pytest.raises(ValueError, match="empty"):
        translator.attention_for("   ")


# ------------------------------------------------------------------------------- ensembles


def test_ensemble_end_to_end(
    checkpoint: Path,
    checkpoint_b: Path,
    model,  # noqa: ANN001
    model_b,  # noqa: ANN001
    tokenizer: Tokenizer,
    tmp_path: Path,
) -> None:
    """`-c A -c B` (two sizes) translates as `Ensemble([A, B])`; the plot is the first one's."""
    png = tmp_path / "attn.png"
    args = ("-c", str(checkpoint.parents[1]), "-c", str(checkpoint_b), "--beam", "3")
    result = run_cli(*args, "--plot-attention", str(png), *INPUTS)
    assert result.returncode == 0, result.stderr.decode()
    cfg = SearchConfig(beam_size=3)
    expected = Translator(Ensemble([model, model_b]), tokenizer, cfg).translate(INPUTS)
    assert result.stdout.decode().split("\n")[:-1] == expected
    assert expected != Translator(model, tokenizer, cfg).translate(INPUTS)
    assert expected[1] == "" and all(expected[i] for i in (0, 2, 3))
    assert png.read_bytes().startswith(b"\x89PNG")


def test_ensemble_of_two_copies_is_one(capsys: pytest.CaptureFixture, checkpoint: Path) -> None:
    args = ("--beam", "3", "--nbest", "2", *INPUTS)
    status, one, err = call_main(capsys, "-c", str(checkpoint), *args)
    assert status == 0, err
    status, two, err = call_main(capsys, "-c", str(checkpoint), "-c", str(checkpoint), *args)
    assert status == 0, err
    assert two == one


def test_ensemble_needs_one_tokenizer(
    checkpoint: Path,
    tmp_path: Path,
    tiny_model,  # noqa: ANN001
) -> None:
    other_tokenizer = tiny_tokenizer(tmp_path / "spm", vocab_size=80)
    other_model = tiny_model(vocab_size=other_tokenizer.src_vocab_size, seed=1, **SEARCH_MODEL)
    other = tmp_path / "other.pt"
    save_checkpoint(other, model_payload(other_model, other_tokenizer))
    result = run_cli("-c", str(checkpoint), "-c", str(other), "Ein Mann.")
    assert result.returncode == 1 and result.stdout == b""
    assert_one_line_error(result.stderr.decode(), "different tokenizer", str(other))


# ------------------------------------------------------------------------------- streaming

STREAM = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Park.", "Die Sonne scheint."]


def test_pipe_gets_each_translation_before_the_next_line(
    checkpoint: Path,
    model,  # noqa: ANN001
    tokenizer: Tokenizer,
) -> None:
    """Through a pipe, a line's translation comes back while stdin is still open."""
    expected = Translator(model, tokenizer, SearchConfig(beam_size=2)).translate(STREAM)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "translate.py"), "-c", str(checkpoint), "--beam", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
    )
    lines: queue.Queue[bytes] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    try:
        for sentence, translation in zip(STREAM, expected, strict=True):
            proc.stdin.write(f"{sentence}\n".encode())
            proc.stdin.flush()
            try:
                got = lines.get(timeout=120)  # the next line is written only after this one
            except queue.Empty:
                pytest.fail(f"no translation of {sentence!r} in 120 s (status {proc.poll()})")
            assert got.decode() == f"{translation}\n"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()


# 11 lines: empty and blank ones, at chunk edges (--buffer-size 3) and at the end.
CHUNKED = [
    "Ein Mann fährt Fahrrad.",
    "",
    "Zwei Hunde spielen im Park.",
    "  ",
    "Die Sonne scheint.",
    "Es regnet in der Stadt.",
    "",
    "Ein Hund fängt einen Ball.",
    "Der Zug fährt schnell.",
    "Eine Frau lächelt.",
    "",
]


def test_chunked_input_gives_the_same_output(
    capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path
) -> None:
    path = tmp_path / "in.de"
    path.write_text("\n".join(CHUNKED) + "\n", encoding="utf-8")
    args = ("-c", str(checkpoint), "--beam", "2", "--input", str(path))
    status, whole, err = call_main(capsys, *args)
    assert status == 0, err
    lines = whole.split("\n")[:-1]
    assert len(lines) == len(CHUNKED)
    assert [bool(line) for line in lines] == [bool(s.strip()) for s in CHUNKED]
    status, chunked, err = call_main(capsys, *args, "--buffer-size", "3")
    assert status == 0, err
    assert chunked == whole
    status, nbest, err = call_main(capsys, *args, "--buffer-size", "3", "--nbest", "2")
    assert status == 0, err
    indices = [int(line.split(" ||| ")[0]) for line in nbest.splitlines()]
    assert sorted(set(indices)) == list(range(len(CHUNKED))) and indices == sorted(indices)


def test_progress_bar_on_a_terminal(
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    checkpoint: Path,
    tmp_path: Path,
) -> None:
    path = tmp_path / "in.de"
    path.write_text("\n".join(CHUNKED) + "\n", encoding="utf-8")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    args = ("-c", str(checkpoint), "--beam", "1", "--input", str(path), "--buffer-size", "4")
    status, out, err = call_main(capsys, *args)
    assert status == 0, err
    assert len(out.split("\n")[:-1]) == len(CHUNKED)
    assert f"{len(CHUNKED)}/{len(CHUNKED)}" in err and "sent/s" in err


def test_output_is_atomic_when_the_input_fails_midway(
    capsys: pytest.CaptureFixture, checkpoint: Path, tmp_path: Path
) -> None:
    """Invalid UTF-8 on line 5, after two chunks are written: the old --output stays."""
    output = tmp_path / "hyp.en"
    output.write_text("old\n", encoding="utf-8")
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"Ein Hund.\n" * 4 + "Grüße\n".encode("latin-1"))
    args = ("-c", str(checkpoint), "--input", str(bad), "--output", str(output))
    status, out, err = call_main(capsys, *args, "--buffer-size", "2")
    assert status != 0
    assert_one_line_error(err, "bad.de", "line 5", "UTF-8")
    assert output.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.de", "hyp.en"]  # no temp file


def test_output_is_atomic_when_ref_mismatch_shows_at_the_end(
    checkpoint: Path, tmp_path: Path
) -> None:
    """From a pipe, --ref's line count can only be checked after the last line."""
    output = tmp_path / "hyp.en"
    output.write_text("old\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("one\ntwo\n", encoding="utf-8")
    args = ("-c", str(checkpoint), "--output", str(output), "--ref", str(tmp_path / "ref.en"))
    result = run_cli(*args, stdin="Ein Hund.\nZwei Hunde.\nDrei.\n")
    assert result.returncode == 1
    assert_one_line_error(result.stderr.decode(), "2 lines", "has 3")
    assert output.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.en", "ref.en"]


def test_ctrl_c_keeps_the_old_output(checkpoint: Path, tmp_path: Path) -> None:
    """SIGINT while waiting for input: exit 130, old --output intact, temp file removed."""
    output = tmp_path / "hyp.en"
    output.write_text("old\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "translate.py"),
            "-c",
            str(checkpoint),
            "--output",
            str(output),
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
        # As a shell starts a foreground job: SIGINT at its default. A disposition of SIG_IGN
        # in the test process (left by some library) would be inherited through exec, and
        # Python then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        proc.stdin.write(b"Ein Hund.\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".hyp.en.*.tmp")):  # translating into the temp file
            assert proc.poll() is None and time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        assert "interrupted" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stderr.close()
    assert output.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hyp.en"]
