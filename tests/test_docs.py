"""The docs against the code: every command and link of README.md, docs/*.md, the YAML comments,
the entry points' docstrings and `--help` (tests/docs_check.py), and that the checker fails
on a wrong line, so a command added to the docs with a wrong flag or key fails CI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import docs_check as dc
from tests.docs_check import ROOT


def test_every_command_and_link_of_the_docs_matches_the_code():
    result = subprocess.run(
        [sys.executable, "-m", "tests.docs_check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(result.stdout)  # the skipped commands and why (pytest -rP shows it)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    checked = int(summary.split(": ")[1].split()[0])
    assert checked >= 200, summary  # the extraction found the docs' commands


def _check(markdown: str, name: str = "docs/new.md") -> list[dc.Outcome]:
    return [dc.check_command(c) for c in dc.markdown_commands(markdown, name)]


def _one_failure(markdown: str) -> str:
    outcomes = _check(markdown)
    assert [o.status for o in outcomes] == ["failed"], outcomes
    return f"{outcomes[0].command.where()}: {outcomes[0].detail}"


BLOCK = "Some text.\n\n```bash\n{}\n```\n"


def test_a_wrong_translate_flag_fails_with_file_line_and_argparse_error():
    failure = _one_failure(BLOCK.format("python translate.py -c RUN_DIR --beam-size 5 a"))
    assert failure.startswith("docs/new.md:4: ")
    assert "unrecognized arguments: --beam-size" in failure


@pytest.mark.parametrize(
    "line, why",
    [
        ("python serve.py -c RUN_DIR --quantize int4", "invalid choice: 'int4'"),
        ("python scripts/export.py onnx -c RUN_DIR -o out", "invalid choice: 'onnx'"),
        (
            "python scripts/average_checkpoints.py --run-dir R --lats 5 --output a.pt",
            "unrecognized",
        ),
        ("python -m benchmarks.load_server -c RUN --no-such-flag", "unrecognized arguments"),
        ("python -m benchmarks.no_such_benchmark", "no module 'benchmarks.no_such_benchmark'"),
        ("python scripts/no_such_script.py", "no such file"),
        ("torchrun --nproc-per-nodes=2 train.py", "unrecognized arguments"),
        ("make no-such-target", "No rule to make target"),
        ("sbatch scripts/slurm/train.sbatch trainer.max_stepz=5", "trainer.max_stepz"),
        ("curl -s localhost:8000/translations -d '{}'", "no route '/translations'"),
        ("curl -s localhost:8000/translate -d '{\"sentences\": [}'", "not JSON"),
        (".venv/bin/pip install -e '.[exports]'", "no extra 'exports'"),
        ("frobnicate --all", "no checker for 'frobnicate'"),
    ],
)
def test_a_wrong_command_fails(line, why):
    assert why in _one_failure(BLOCK.format(line))


@pytest.mark.parametrize(
    "line, why",
    [
        ("python train.py trainer.max_stepz=200", "trainer.max_stepz"),
        ("python train.py experiment=no_such_experiment", "no_such_experiment"),
        ("python train.py trainer.max_steps=many", "config rejected"),
        ("python train.py optim.lr=1e-3,2e-3", "needs -m/--multirun"),
        ("python train.py -m optim.lr=1e-3,2e-3 model.dropoutt=0.1", "model.dropoutt"),
        ("python train.py tokenizer.user_symbols=['<BT>']", "tokenizer.user_symbols"),  # unquoted
        ("python train.py --cfg jobs", "train.py (Hydra)"),
    ],
)
def test_a_wrong_train_override_fails(line, why):
    assert why in _one_failure(BLOCK.format(line))


def test_right_commands_pass_and_a_tagged_block_is_skipped_with_its_reason():
    markdown = (
        BLOCK.format(
            "python train.py -m optim.lr=1e-3,2e-3 hydra.run.dir=/tmp/x  # a comment\n"
            "python train.py \"tokenizer.user_symbols=['<BT>']\" experiment=multi30k_en_de_bt\n"
            "echo 'A man.' | OMP_NUM_THREADS=1 python translate.py -c RUN_DIR --beam 5\n"
            "torchrun --nproc_per_node=2 train.py model=small trainer.update_freq=2\n"
            "python serve.py -c RUN_DIR --port PORT --max-sentences N  # integer placeholders"
        )
        + "<!-- docs-check: skip curl: needs a running serve.py -->\n"
        + "```bash\ncurl -s localhost:8000/nowhere\npython serve.py -c RUN_DIR --port 0\n```\n"
    )
    outcomes = _check(markdown)
    assert [o.status for o in outcomes] == ["ok"] * 5 + ["skipped", "ok"], outcomes
    assert outcomes[5].detail == "needs a running serve.py"


def test_inline_commands_and_overrides_in_prose_are_checked():
    ok = (
        "Run `python translate.py -c RUN --nbest 3` or set `trainer.max_steps=N` and `model=small`."
    )
    assert [o.status for o in _check(ok)] == ["ok"] * 3
    assert "trainer.warmup_stepz" in _one_failure("Set `trainer.warmup_stepz=100`.")
    assert "no_such_experiment" in _one_failure("Run `experiment=no_such_experiment`.")
    # a key of one experiment only composes after it
    assert [o.status for o in _check("Set `data.corpora.bt.weight=0.5`.")] == ["ok"]


def test_commands_in_yaml_comments_are_checked():
    yaml = "# Train it:\n#   python train.py experiment=multi30k_en_de trainer.max_stepz=3\nx: 1\n"
    (outcome,) = [dc.check_command(c) for c in dc.comment_commands(yaml, "conf/x.yaml")]
    assert outcome.status == "failed" and outcome.command.where() == "conf/x.yaml:2"


def test_links_and_anchors_resolve():
    report = dc.Report()
    dc.markdown_links(
        report,
        "[a](training.md#fine-tuning-starting-from-a-trained-model) [b](training.md#no-such-heading)\n"
        "[c](nowhere.md) [d](https://example.com) [e](#contents)\n",
        "docs/new.md",
    )
    assert report.links_checked == 4
    assert report.link_failures == [
        "docs/new.md:1: link 'training.md#no-such-heading': training.md has no heading "
        "#no-such-heading",
        "docs/new.md:2: link 'nowhere.md': no such file",
        "docs/new.md:2: link '#contents': new.md has no heading #contents",
    ]


def test_github_slugs():
    assert dc.github_slug("Fine-tuning from a trained model") == "fine-tuning-from-a-trained-model"
    assert (
        dc.github_slug("`translate.py`: flags, search & more") == "translatepy-flags-search--more"
    )
    assert dc.github_slug("Speed (CPU, 2 threads)") == "speed-cpu-2-threads"


def test_names_of_code_and_config_keys_in_prose_must_exist():
    report = dc.Report()
    dc.check_names(
        report,
        "`exporting.hf.hf_search_ids`, `data.max_len`, `engine/cache.py`, `model.safetensors`\n"
        "`export.convert.hf_search_ids`, `cli.translate.no_such`, `engine/nowhere.py`\n",
        "docs/new.md",
    )
    assert report.link_failures == [
        "docs/new.md:2: `export.convert.hf_search_ids`: no such module",
        "docs/new.md:2: `cli.translate.no_such`: attnmt.cli.translate has no 'no_such'",
        "docs/new.md:2: `engine/nowhere.py`: no such file",
    ]


def test_every_config_key_and_experiment_is_in_configuration_md(monkeypatch, tmp_path):
    (tmp_path / "docs").mkdir()
    page = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    (tmp_path / "docs/configuration.md").write_text(
        page.replace("user_symbols", "symbols").replace("`tatoeba_en_defr`", "`x`")
    )
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    monkeypatch.setattr(dc, "ROOT", tmp_path)
    report = dc.Report()
    dc.check_config_keys(report)
    assert report.link_failures == [
        "docs/configuration.md: experiment `tatoeba_en_defr` "
        "(conf/experiment/tatoeba_en_defr.yaml) is not described",
        "docs/configuration.md: key `tokenizer.user_symbols` (conf/tokenizer/spm_joint.yaml) "
        "is not in its table (## tokenizer)",
    ]


def test_search_flag_help_names_the_other_flags_and_keeps_its_own_words():
    from attnmt.cli.translate import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--sampling: random seed; the same seed and input give the same output" in text
    assert "random --seed" not in text
    assert "(<= --beam)" in text  # another flag's field name becomes the flag


def test_a_program_that_needs_a_missing_optional_package_is_skipped_with_the_reason(tmp_path):
    script = tmp_path / "needs_extra.py"
    script.write_text("import no_such_optional_package\n")
    (outcome,) = _check(BLOCK.format(f"python {script} --flag"))
    assert outcome.status == "skipped"
    assert outcome.detail == "needs the package 'no_such_optional_package', not installed here"


def test_file_names_with_dots_are_not_taken_for_python_names():
    report = dc.Report()
    dc.check_names(report, "`last.pt.tmp`, `hyp.test2016.de`, `model.safetensors`\n", "x.md")
    assert report.link_failures == []


def test_an_inline_command_wrapped_over_two_lines_is_checked_whole():
    failure = _one_failure("Text.\n\nRun `python translate.py -c RUN\n--beam-size 5` to see.\n")
    assert failure.startswith("docs/new.md:3: ") and "--beam-size" in failure
