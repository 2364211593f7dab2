"""No flag is accepted and then left unused: translate.py --score does no search (so --beam,
--max-len-a/-b, --inter-threads and --plot-attention are refused beside it) but uses --tag;
--sampling draws instead of searching (a typed --beam is refused, in distill.py too);
average_checkpoints.py's --last counts a run dir's checkpoints only; serve.py's --key-rate
caps --api-keys' keys only."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnmt.cli import average, translate
from attnmt.decoding.stream import score_input

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def one_error(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(f"{prog}: error:")
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--beam", "3"], "--score scores given translations: drop --beam"),
        (["--max-len-a", "2"], "drop --max-len-a"),
        (["--max-len-b", "5"], "drop --max-len-b"),
        (["--inter-threads", "2"], "drop --inter-threads"),
        (["--plot-attention", "a.png"], "drop --plot-attention"),
    ],
)
def test_score_refuses_the_search_flags_it_would_not_use(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path, flags, words
) -> None:  # noqa: ANN001
    hyps = tmp_path / "hyps.en"
    hyps.write_text("a man\n")
    status = translate.main(["-c", str(checkpoint), "--score", str(hyps), *flags, "ein Mann"])
    assert status == 1 and words in one_error(capsys, "translate.py")


def test_sampling_refuses_a_typed_beam(capsys: pytest.CaptureFixture[str], checkpoint) -> None:  # noqa: ANN001
    status = translate.main(["-c", str(checkpoint), "--sampling", "--beam", "3", "ein Mann"])
    assert status == 1
    assert one_error(capsys, "translate.py").endswith("beam search: drop --beam")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "distill.py"), "--teacher", str(checkpoint)]
        + ["--data-dir", "d", "--out", "o", "--sampling", "--beam", "3", "--nbest", "2"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "distill.py: error: --sampling draws each token instead of a beam search: drop --beam"
    ]


def test_score_puts_the_tag_before_each_source_as_translating_does() -> None:
    seen: list[list[str]] = []

    def score(sources: list[str], translations: list[str]) -> list:
        seen.append(sources)
        return [SimpleNamespace(score=0.0, log_prob=0.0, token_log_probs=[0.0]) for _ in sources]

    source = SimpleNamespace(batches=lambda: iter([["Ein Mann.", "", "Zwei Hunde."]]))
    given = SimpleNamespace(take=lambda n: ["A man.", "", "Two dogs."][:n])
    out = io.BytesIO()
    done = score_input(SimpleNamespace(score=score), source, out, given, False, "<2en>")
    assert seen == [["<2en> Ein Mann.", "", "<2en> Zwei Hunde."]] and done.lines == 3
    assert out.getvalue().decode().count("\n") == 3


def test_average_refuses_last_without_a_run_dir(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    argv = ["--inputs", str(checkpoint), str(checkpoint), "--output", str(tmp_path / "a.pt")]
    assert average.main([*argv, "--last", "2"]) == 1
    line = one_error(capsys, "average_checkpoints.py")
    assert "--last counts a run dir's checkpoints" in line and not (tmp_path / "a.pt").exists()
    assert average.main(argv) == 0 and (tmp_path / "a.pt").exists()  # without it: as before


def test_serve_refuses_a_key_rate_without_keys(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnmt.cli import serve

    def serve_them(*args: object) -> None:
        raise AssertionError("serve.py went on to serve")

    monkeypatch.setattr(serve, "serve", serve_them)
    assert serve.main(["-c", str(checkpoint), "--port", "0", "--key-rate", "5"]) != 0
    assert "--key-rate caps the keys of --api-keys FILE" in one_error(capsys, "serve.py")


def test_sentences_and_input_are_not_both_taken(
    capsys: pytest.CaptureFixture[str], checkpoint: Path, tmp_path: Path
) -> None:
    """Positional sentences won and --input FILE was never read."""
    source = tmp_path / "src.de"
    source.write_text("ein Mann\n")
    assert translate.main(["-c", str(checkpoint), "--input", str(source), "ein Hund"]) == 1
    assert "both give the input: keep one" in one_error(capsys, "translate.py")
