"""Check the commands and links of the docs against the code (`tests/test_docs.py` runs it).

    python -m tests.docs_check            # every command and link; one line per problem
    python -m tests.docs_check -v         # also each command checked or skipped, and how

Commands come from fenced `bash`/`sh`/`shell`/`console` blocks (and `$ ` lines of any block)
and inline code spans of README.md and docs/*.md, from the comments of conf/**/*.yaml and of
scripts/*.sh and scripts/slurm/*, from the module docstrings of the entry points, scripts and
benchmarks, and from the `--help` text of translate.py and serve.py. Nothing is run: each
command is checked the cheapest way that proves it is current:
- `python train.py ...` (also through `torchrun`, `sbatch` of the SLURM script, `make train`):
  Hydra's own flag parser, then the config composed in-process with the line's overrides and
  turned into the typed configs, as `train.py --cfg job` would, so every group, key and value
  type exists (a sweep `-m a=1,2` composes each value);
- `python translate.py`/`serve.py`/`scripts/*.py`, `python -m benchmarks.X` and other modules:
  the program is run in-process up to its `parse_args`, which parses the line and stops it
  (a wrong flag or choice is argparse's error); `scripts/prepare_data.py` composes like train.py;
- `torchrun` parses its own flags with torch's parser; `make T` runs `make -n T` and checks the
  commands it prints; shell scripts exist and pass `bash -n`, and the environment variables the
  line sets are read by the script; `pip install -e ".[x]"` names extras of pyproject.toml;
  `pytest -m EXPR` names registered markers.
A command this checker cannot check (it needs a running server, SLURM, the network, ...) is
skipped only when the docs say so: an HTML comment right above its fenced block,

    <!-- docs-check: skip curl: needs a running serve.py -->

skips the block's lines whose program is `curl` (or whose script or module is the word named, e.g.
`tests.test_serve_page`; `*`: every line), or, above a paragraph, the commands in its inline code;
the report names each skipped command with the reason. A command of an unknown program, untagged, is
a failure.

Links: every relative Markdown link `[text](path#anchor)` in README.md and docs/*.md, and every
`docs/NAME.md#anchor` or `README.md#anchor` written in YAML, Python, shell and Makefile text,
must name an existing file, and the anchor one of its headings (GitHub's slugs).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# First words that make a code span or docstring line a command (after `VAR=value` prefixes).
PROGRAMS = (
    "python",
    "python3",
    ".venv/bin/python",
    "torchrun",
    "make",
    "sbatch",
    "curl",
    "pip",
    ".venv/bin/pip",
    ".venv/bin/tensorboard",
    "tensorboard",
    "pytest",
    "scripts/",
    "./scripts/",
)
SKIP_TAG = re.compile(r"<!--\s*docs-check:\s*skip\s+(\S+?):\s*(.+?)\s*-->")
# Environment variables read by torch, the C libraries or every program of ours, not by a script.
GENERAL_ENV = r"(OMP_|MKL_|KMP_|CUDA_|NCCL_|HF_|TORCH|PYTHON|ATTNMT_)"
# Words that only print or feed text to the checked command of a pipeline.
TRIVIAL = {"echo", "printf", "cat", "cd", "export", "head", "tail", "sort", "wc", "diff"}


@dataclass
class Command:
    file: str  # repository-relative
    line: int  # 1-based line of its first physical line
    text: str  # one logical line: continuations joined, `$ ` and comments stripped
    skip: str | None = None  # the tag's reason when the docs say to skip it
    inline: bool = False  # an inline code span (may be a fragment: "python -m benchmarks.X")

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Outcome:
    command: Command
    status: str  # "ok", "skipped", "failed"
    detail: str = ""


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    links_checked: int = 0
    names_checked: int = 0
    link_failures: list[str] = field(default_factory=list)

    def failures(self) -> list[str]:
        failed = [
            f"{o.command.where()}: `{o.command.text}`: {o.detail}"
            for o in self.outcomes
            if o.status == "failed"
        ]
        return failed + self.link_failures


class CheckError(Exception):
    """Why a command does not match the code (one line)."""


class NotHere(Exception):
    """The command cannot be checked in this environment (an optional package is missing)."""


# ----------------------------------------------------------------------------- extraction


def _is_command(words: list[str]) -> bool:
    words = _strip_env(words)
    return bool(words) and any(
        words[0] == p or (p.endswith("/") and words[0].startswith(p)) for p in PROGRAMS
    )


OVERRIDE = re.compile(
    r"[+~]?(model|data|tokenizer|optim|trainer|decoding|logger|experiment|debug)(\.[a-z0-9_.]+)?=.*"
)
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|\.\.\.|…")  # K, RUN_DIR, ...


def _is_override_span(words: list[str]) -> bool:
    """`trainer.init_from=RUN_DIR`, `experiment=x model=y`: train.py overrides in prose."""
    return bool(words) and all(OVERRIDE.fullmatch(w) for w in words)


def _strip_env(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    return words[i:]


def _split(text: str) -> list[str]:
    return shlex.split(_unplaceholder(text), comments=True)


def _unplaceholder(text: str) -> str:
    """Drop usage notation: `<train.py overrides>`, `[MULTI30K_DIR]` (not `.[export]`)."""
    text = re.sub(r"<[^<>'\"]* [^<>'\"]*>", " ", text)
    return re.sub(r"(?<!\S)\[[^\]'\"]*\]", " ", text)


def markdown_commands(text: str, rel: str) -> list[Command]:
    """The commands of a Markdown file's text (`rel`: its name in the report)."""
    lines = text.splitlines()
    out: list[Command] = []
    fence: str | None = None  # the open block's language
    skips: dict[str, str] = {}  # of the open block
    pending: dict[str, str] = {}  # tags read, for the block or paragraph that follows
    paragraph: dict[str, str] = {}  # of the paragraph being read (its inline spans)
    para: list[int] = []  # the indices of the paragraph's lines

    def flush() -> None:
        """The inline code spans of the paragraph, which may run over a line break."""
        joined = "\n".join(lines[k] for k in para)
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
            span = " ".join(m.group(1).split())
            try:
                words = _split(span)
            except ValueError:
                continue
            if _is_command(words) or _is_override_span(words):
                line = para[joined.count("\n", 0, m.start())] + 1
                out.append(_tagged(Command(rel, line, span, inline=True), paragraph))
        para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if fence is None:
            m = SKIP_TAG.search(line)
            if m or line.startswith("```") or not line.strip():
                flush()
                paragraph = {}
            if m:
                pending[m.group(1)] = m.group(2)
            elif line.startswith("```"):
                fence = line[3:].strip().lower()
                skips, pending = pending, {}
            elif line.strip():
                if pending:
                    paragraph, pending = pending, {}
                para.append(i)
            i += 1
            continue
        if line.startswith("```"):
            fence = None
            i += 1
            continue
        start = i
        text = line
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        i += 1
        stripped = text.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        elif fence not in SHELL_LANGS or fence == "console":
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if fence in ("bash", "sh") and _in_script_block(lines, start):
            continue  # a script's text (shown byte-identical elsewhere), not commands to type
        out.append(_tagged(Command(rel, start + 1, stripped), skips))
    flush()
    return out


def _in_script_block(lines: list[str], index: int) -> bool:
    """Whether the block holding lines[index] is a script (starts with a `#!` line)."""
    j = index
    while j > 0 and not lines[j - 1].startswith("```"):
        j -= 1
    return lines[j].startswith("#!")


def _tagged(command: Command, skips: dict[str, str]) -> Command:
    try:
        words = _strip_env(_split(command.text))
    except ValueError:
        return command
    names = {w for w in words[:3] if not w.startswith("-")} | {Path(w).name for w in words[:1]}
    for key, reason in skips.items():
        if key == "*" or key in names:  # the program, or the script or module it runs
            command.skip = reason
    return command


def comment_commands(text: str, rel: str) -> list[Command]:
    """`#   cmd` lines of YAML and shell comments."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*#+ {2,}(\S.*)$", line)  # "#   cmd": a command, "# text": prose
        if not m:
            continue
        text = m.group(1).split("  #")[0].strip()
        text = re.sub(r"\s{2,}\(.*\)$", "", text)  # "cmd   (a note)"
        try:
            words = _split(text)
        except ValueError:
            continue
        if _is_command(words):
            out.append(Command(rel, n, text))
    return out


def docstring_commands(path: Path) -> list[Command]:
    """Indented command lines of a module docstring."""
    rel = path.relative_to(ROOT).as_posix()
    source = path.read_text(encoding="utf-8")
    m = re.match(r'(?:#.*\n|\s*\n)*\s*(?:r?"""|\'\'\')(.*?)(?:"""|\'\'\')', source, re.S)
    if not m:
        return []
    first = source[: m.start(1)].count("\n") + 1
    out = []
    lines = m.group(1).splitlines()
    n = -1
    while n + 1 < len(lines):
        n += 1
        line = lines[n]
        if not line.startswith("    "):
            continue
        start = n
        while line.rstrip().endswith("\\") and n + 1 < len(lines):  # `\` in the source
            n += 1
            line = line.rstrip().rstrip("\\") + " " + lines[n].strip()
        text = line.strip().split("  #")[0].strip()
        try:
            words = _split(text)
        except ValueError:
            continue
        if _is_command(words):
            out.append(Command(rel, first + start, text))
    return out


def help_commands() -> list[Command]:
    """Command lines shown in translate.py's and serve.py's `--help`."""
    from attnmt.cli.serve import build_parser as serve_parser
    from attnmt.cli.translate import build_parser as translate_parser

    out = []
    for rel, build in (("cli/translate.py", translate_parser), ("cli/serve.py", serve_parser)):
        text = build().format_help()
        for m in re.finditer(r"`([^`]+)`", text):
            try:
                words = _split(m.group(1))
            except ValueError:
                continue
            if _is_command(words):
                out.append(Command(f"{rel} (--help)", 1, " ".join(m.group(1).split())))
    return out


def _read(path: Path) -> tuple[str, str]:
    return path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()


def all_commands() -> list[Command]:
    commands: list[Command] = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        commands += markdown_commands(*_read(md))
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        commands += comment_commands(*_read(path))
    shells = [*sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "scripts/slurm").glob("*"))]
    for path in shells:
        commands += comment_commands(*_read(path))
    for path in [
        *sorted(ROOT.glob("*.py")),
        *sorted((ROOT / "scripts").glob("*.py")),
        *sorted((ROOT / "cli").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]:
        commands += docstring_commands(path)
    commands += help_commands()
    return commands


# ----------------------------------------------------------------------------- checks


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _stop_at_parse_args() -> Iterator[None]:
    """Every ArgumentParser parses as usual, then raises _Parsed instead of returning."""
    original_parse = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    inside = []

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001
        inside.append(1)
        try:
            original_parse(self, args, namespace)
        finally:
            inside.pop()
        raise _Parsed

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001
        result = original_known(self, args, namespace)
        if not inside:
            raise _Parsed
        return result

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original_parse  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = original_known  # type: ignore[method-assign]


def _placeholders_as_numbers(parse):  # noqa: ANN001, ANN202
    """`--max-restarts=N`, `--beam K`: a numeric flag given an ALL-CAPS placeholder in the docs
    is parsed again with 1 in its place (any other error stands)."""

    @functools.wraps(parse)
    def retry(*args):  # noqa: ANN002, ANN202
        *head, argv = args
        for _ in range(8):
            try:
                return parse(*head, argv)
            except CheckError as e:
                not_numbers = r"(?:invalid \w+ value|is not a number|is not an integer|must be)"
                m = re.search(not_numbers + r".*?'([A-Z][A-Z0-9_]*)'", str(e))
                m = m or re.search(r"'([A-Z][A-Z0-9_]*)' " + not_numbers, str(e))
                if not m:
                    raise
                word = m.group(1)
                fixed = [re.sub(rf"(?<==){word}$|^{word}$", "1", a) for a in argv]
                if fixed == argv:
                    raise
                argv = fixed
        return parse(*head, argv)

    return retry


@_placeholders_as_numbers
def _parse_with_program(kind: str, target: str, args: list[str]) -> None:
    """Run a script (kind "path") or module ("module") until it parses `args`."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    err = io.StringIO()
    sys.argv = [target, *args]
    try:
        with (
            _stop_at_parse_args(),
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            if kind == "path":
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                _check_importable(target)
                sys.modules.pop(target, None)  # as `python -m` runs it: not the imported copy
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except _Parsed:
        return
    except SystemExit as e:
        if e.code in (0, None):
            return  # --help
        lines = [
            x for x in err.getvalue().splitlines() if "error" in x
        ] or err.getvalue().splitlines()
        raise CheckError(lines[-1] if lines else f"exit {e.code}") from None
    except ImportError as e:
        top = (e.name or "").split(".")[0]
        if top and top not in PACKAGES and not (ROOT / top).exists():
            raise NotHere(f"needs the package {top!r}, not installed here") from None
        raise CheckError(f"{target}: cannot import {e.name!r}: {e}") from None
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    raise CheckError(f"{target} returned without parsing its command line; add a checker")


@functools.cache
def _composed(groups: tuple[str, ...]):  # noqa: ANN202 (a DictConfig, imported late)
    """conf/train.yaml composed with config-group choices only (cached: few distinct sets)."""
    from hydra import compose, initialize_config_dir

    import attnmt.training.config  # noqa: F401  (registers decoding/search_config, as train.py does)

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=list(groups), return_hydra_config=True)


@functools.cache
def _compose_train(overrides: tuple[str, ...], typed: bool = True) -> None:
    """What `train.py OVERRIDES --cfg job` does, in-process: compose, then the typed configs.

    The group choices (`experiment=`, `model=`, ...) are composed by Hydra and cached; the
    value overrides are applied to a copy by Hydra's own code for that step, so the errors are
    Hydra's ("Could not override 'x'", "Key 'x' is not in struct")."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from attnmt.training.config import Configs

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        is_group = [(ROOT / "conf" / o.key_or_group).is_dir() for o in parsed]
        groups = tuple(o.input_line for o, g in zip(parsed, is_group, strict=True) if g)
        cfg = copy.deepcopy(_composed(groups))
        values = [o for o, g in zip(parsed, is_group, strict=True) if not g]
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        with open_dict(cfg):
            del cfg["hydra"]  # needs Hydra's runtime to resolve; composing checked its keys
        if typed:
            Configs.from_hydra(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise CheckError(f"does not compose: {str(e).splitlines()[0]}") from None
    except Exception as e:  # a typed-config error (UserError) or a value of the wrong type
        raise CheckError(f"config rejected: {str(e).splitlines()[0]}") from None


def _experiments() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf/experiment").glob("*.yaml"))


def _check_prose_overrides(words: list[str]) -> str:
    """Overrides quoted in prose: they compose alone or after some `experiment=X` (keys such
    as `data.corpora.bt.weight` exist in one experiment only); an ALL-CAPS value is a
    placeholder, so only the key is checked."""
    typed = True
    overrides = []
    for w in words:
        key, _, value = w.partition("=")
        if PLACEHOLDER.fullmatch(value):
            if (ROOT / "conf" / key.lstrip("+~")).is_dir():
                continue  # `model=PRESET`: the group exists (else the key's check fails)
            typed, w = False, f"{key}='...'"
        overrides.append(w)
    problems = []
    for prefix in [[], *([f"experiment={e}"] for e in _experiments())]:
        if any(o.startswith("experiment=") for o in overrides) and prefix:
            break
        try:
            _compose_train(tuple(prefix + overrides), typed)
            return "composed" + (f" after {prefix[0]}" if prefix else "")
        except CheckError as e:
            problems.append(str(e))
    raise CheckError(problems[0])


def _check_train_overrides(overrides: list[str], multirun: bool) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    overrides = [
        re.sub(r"=(\.\.\.|…)$", "='...'", o) for o in overrides if o not in ("...", "…")
    ]  # "key=..." in prose: any value
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        raise CheckError(f"bad override in {overrides}: {str(e).splitlines()[0]}") from None
    combos: list[list[str]] = [[]]
    for o in parsed:
        if o.is_sweep_override():
            if not multirun:
                raise CheckError(f"{o.input_line!r} is a sweep: needs -m/--multirun")
            values = list(o.sweep_string_iterator())
            key = o.get_key_element()
            combos = [c + [f"{key}={v}"] for c in combos for v in values]
        else:
            combos = [c + [o.input_line] for c in combos]
    for combo in combos:
        _compose_train(tuple(combo))


def check_train(args: list[str]) -> str:
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            ns = get_args_parser().parse_args(args)
    except SystemExit:
        raise CheckError(f"train.py (Hydra): {err.getvalue().strip().splitlines()[-1]}") from None
    if ns.help or ns.hydra_help:
        return "Hydra --help"
    _check_train_overrides(ns.overrides, ns.multirun)
    return "composed"


def check_python(args: list[str]) -> str:
    """`python [-X opts] (SCRIPT | -m MODULE | -c CODE) ARGS`."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-m", "-c"):
        i += 1
    if i >= len(args):
        raise CheckError("python without a script or -m")
    if args[i] == "-c":
        return "python -c (not checked)"
    if args[i] == "-m":
        module, rest = args[i + 1], args[i + 2 :]
        if module == "pytest":
            return check_pytest(rest)
        if module in ("pip",):
            return check_pip(rest)
        _parse_with_program("module", module, rest)
        return "parsed"
    script, rest = args[i], args[i + 1 :]
    path = ROOT / script
    if not path.is_file():
        raise CheckError(f"{script}: no such file")
    if path.name == "train.py" and path.parent == ROOT:
        return check_train(rest)
    if script == "scripts/prepare_data.py":
        if rest[:1] in (["-h"], ["--help"]):
            return "--help"
        _check_train_overrides([o for o in rest if not o.startswith("hydra.")], False)
        return "composed"
    _parse_with_program("path", script, rest)
    return "parsed"


def check_torchrun(args: list[str]) -> str:
    if not any(a.endswith(".py") or a == "-m" for a in args):
        args = [*args, "train.py"]  # torchrun's flags named in prose, without the script
    return _torchrun(args)


@_placeholders_as_numbers
def _torchrun(args: list[str]) -> str:
    from torch.distributed.run import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            ns = get_args_parser().parse_args(args)
    except SystemExit:
        raise CheckError(f"torchrun: {err.getvalue().strip().splitlines()[-1]}") from None
    return "torchrun parsed; " + check_python([ns.training_script, *ns.training_script_args])


def check_shell_script(script: str, args: list[str], env: list[str]) -> str:
    path = ROOT / script
    if not path.is_file():
        raise CheckError(f"{script}: no such file")
    text = path.read_text(encoding="utf-8")
    for name in env:
        if re.match(GENERAL_ENV, name):
            continue
        if not re.search(r"\$\{?" + re.escape(name) + r"\b", text):
            raise CheckError(f"{script} does not read ${name}")
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    if result.returncode:
        raise CheckError(f"bash -n {script}: {result.stderr.strip()}")
    return "script exists, bash -n"


def check_sbatch(args: list[str], env: list[str]) -> str:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    if i >= len(args):
        raise CheckError("sbatch without a script")
    result = check_shell_script(args[i], [], env)
    _check_train_overrides(args[i + 1 :], False)
    return result + "; overrides composed"


@functools.cache
def _make_dry_run(args: tuple[str, ...]) -> str:
    result = subprocess.run(
        ["make", "-n", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if result.returncode:
        raise CheckError(f"make -n: {result.stderr.strip().splitlines()[-1]}")
    return result.stdout


def check_make(args: list[str]) -> str:
    printed = _make_dry_run(tuple(args))
    checked = 0
    for line in printed.replace("\\\n", " ").splitlines():
        words = _split(line)
        if words and words[0].endswith("/python") and len(words) > 1:
            if words[1] in ("train.py", "-m") and words[1:3] != ["-m", "pip"]:
                check_python(words[1:])
                checked += 1
    return f"make -n; {checked} printed command(s) checked"


@functools.cache
def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: the copy pip vendors
        from pip._vendor import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def check_pip(args: list[str]) -> str:
    extras = set(_pyproject()["project"]["optional-dependencies"])
    for arg in args:
        m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if m:
            for extra in m.group(1).split(","):
                if extra not in extras:
                    raise CheckError(f"pyproject.toml has no extra {extra!r}")
    return "extras exist"


def check_pytest(args: list[str]) -> str:
    config = _pyproject()
    markers = {m.split(":")[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            for word in re.findall(r"[A-Za-z_]+", args[i + 1]):
                if word not in ("not", "and", "or") and word not in markers:
                    raise CheckError(f"no pytest marker {word!r}")
        elif arg.startswith("tests/") and not (ROOT / arg.split("::")[0]).exists():
            raise CheckError(f"{arg}: no such file")
    return "markers exist"


def check_curl(args: list[str]) -> str:
    """A request to serve.py: its path is one of the server's routes, a JSON body parses."""
    import json

    urls = [a for a in args if re.match(r"(https?://)?(localhost|127\.0\.0\.1|HOST)[:/]", a)]
    if not urls:
        raise CheckError("curl without a serve.py URL (localhost:PORT/PATH)")
    path = "/" + urls[0].split("://")[-1].partition("/")[2].split("?")[0]
    routes = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "server").glob("*.py"))
    if f'"{path}"' not in routes:
        raise CheckError(f"serve.py has no route {path!r} (server/*.py)")
    for i, arg in enumerate(args[:-1]):
        if arg in ("-d", "--data", "--data-raw") and args[i + 1].lstrip().startswith("{"):
            try:
                json.loads(args[i + 1])
            except json.JSONDecodeError as e:
                raise CheckError(f"the request body is not JSON: {e}") from None
    return "route exists, body parses"


def check_tensorboard(args: list[str]) -> str:
    if "--logdir" not in args and not any(a.startswith("--logdir=") for a in args):
        raise CheckError("tensorboard needs --logdir")
    return "--logdir given"


def check_words(words: list[str], env: list[str]) -> str:
    program = words[0]
    name = Path(program).name
    if name in ("python", "python3"):
        return check_python(words[1:])
    if name == "torchrun":
        return check_torchrun(words[1:])
    if name == "make":
        return check_make(words[1:])
    if name == "sbatch":
        return check_sbatch(words[1:], env)
    if name == "pip":
        return check_pip(words[1:])
    if name == "pytest":
        return check_pytest(words[1:])
    if name == "tensorboard":
        return check_tensorboard(words[1:])
    if name == "curl":
        return check_curl(words[1:])
    if program.endswith(".py"):
        return check_python(words)
    if program.endswith(".sh") or program.startswith(("scripts/", "./scripts/")):
        return check_shell_script(program.removeprefix("./"), words[1:], env)
    raise CheckError(
        f"no checker for {program!r}: add one to tests/docs_check.py or tag the block "
        f"`<!-- docs-check: skip {name}: WHY -->`"
    )


def check_command(command: Command) -> Outcome:
    if command.skip is not None:
        return Outcome(command, "skipped", command.skip)
    try:
        segments = _pipeline(command.text)
        details = []
        for words in segments:
            if command.inline and _is_override_span(words):  # before `X=y` reads as a variable
                details.append(_check_prose_overrides(words))
                continue
            env = [w.split("=", 1)[0] for w in words[: len(words) - len(_strip_env(words))]]
            words = _strip_env(words)
            words = [w for w in words if w not in ("...", "…")]
            if not words or words[0] in TRIVIAL:
                continue
            if command.inline and _is_override_span(words):
                details.append(_check_prose_overrides(words))
                continue
            if command.inline and len(words) == 1:
                details.append(_check_mention(words[0]))
                continue
            if command.inline and _is_bare_module(words):
                details.append(_check_importable(words[2]))
                continue
            details.append(check_words(words, env))
        return Outcome(command, "ok", "; ".join(details))
    except CheckError as e:
        return Outcome(command, "failed", str(e))
    except NotHere as e:
        return Outcome(command, "skipped", str(e))
    except Exception as e:  # a bug of the checker or of the program's start: still one line
        return Outcome(command, "failed", f"{type(e).__name__}: {str(e).splitlines()[:1]}")


def _check_mention(word: str) -> str:
    """A program named in prose without arguments: a path must exist."""
    if "/" in word and not word.startswith(".venv/"):
        if not (ROOT / word).exists():
            raise CheckError(f"{word}: no such file")
        return "path exists"
    return "a name only"


def _is_bare_module(words: list[str]) -> bool:
    """`python -m benchmarks.X` named in prose, without its arguments."""
    return len(words) == 3 and Path(words[0]).name.startswith("python") and words[1] == "-m"


def _check_importable(module: str) -> str:
    import importlib.util

    if module.endswith(".NAME") or module.endswith(".X"):
        return "placeholder"
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        found = None
    if found is None:
        raise CheckError(f"no module {module!r}")
    return "module exists"


def _pipeline(text: str) -> list[list[str]]:
    lexer = shlex.shlex(_unplaceholder(text), posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            segments.append([])
        elif set(token) <= set("<>&"):
            redirect = True
        elif redirect:
            redirect = False  # the redirection's file
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


# ----------------------------------------------------------------------------- links


def github_slug(heading: str) -> str:
    text = re.sub(r"`|\*\*|\*|_(?=\w)|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    return text_anchors(path.read_text(encoding="utf-8"))


def text_anchors(text: str) -> frozenset[str]:
    """The #anchors of a Markdown text: its headings' slugs and `<a id=...>`."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m.group(1))
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
        for m in re.finditer(r'<a\s+(?:id|name)="([^"]+)"', line):
            found.add(m.group(1))
    return frozenset(found)


def check_link(
    source: str, line: int, base: Path, target: str, own: frozenset[str] | None = None
) -> str | None:
    """None when `target` (relative to `base`) resolves, else why not. `own`: the anchors of
    the source itself, for `#anchor` links."""
    path_part, _, anchor = target.partition("#")
    path = (base / path_part).resolve() if path_part else ROOT / source
    if path_part and not path.exists():
        return f"{source}:{line}: link {target!r}: no such file"
    if anchor and path.suffix == ".md":
        found = own if not path_part and own is not None else anchors(path)
        if anchor not in found:
            return f"{source}:{line}: link {target!r}: {path.name} has no heading #{anchor}"
    return None


def markdown_links(report: Report, text: str, rel: str) -> None:
    """Check the relative links `[text](target)` of a Markdown file's text (outside code)."""
    own = text_anchors(text)
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for m in re.finditer(r"\]\(([^)\s]+)\)", line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            report.links_checked += 1
            problem = check_link(rel, n, (ROOT / rel).parent, target, own)
            if problem:
                report.link_failures.append(problem)


def check_links(report: Report) -> None:
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        markdown_links(report, *_read(md))
    texts = [
        *ROOT.glob("*.py"),
        *(ROOT / "conf").rglob("*.yaml"),
        *(ROOT / "scripts").rglob("*"),
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
    ]
    for pkg in (
        "common",
        "model",
        "data",
        "checkpoint",
        "engine",
        "decoding",
        "exporting",
        "evaluation",
        "training",
        "server",
        "benchmarks",
    ):
        texts += (ROOT / pkg).rglob("*.py")
    for path in sorted(set(texts)):
        if not path.is_file():
            continue
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"(?<![\w/.])((?:docs/)?[\w-]+\.md(?:#[\w-]+)?)", line):
                target = m.group(1)
                if not target.startswith(("docs/", "README.md")):
                    continue
                report.links_checked += 1
                problem = check_link(rel, n, ROOT, target)
                if problem:
                    report.link_failures.append(problem)


# ----------------------------------------------------------------------------- names

PACKAGES = (
    "common", "model", "data", "checkpoint", "engine", "decoding", "exporting", "evaluation",
    "training", "server", "cli", "benchmarks",
)  # fmt: skip
# Name parts that make `a.b.c` a file name, not Python.
FILE_PARTS = {
    "safetensors", "bin", "json", "jsonl", "pt", "yaml", "yml", "model", "txt", "md", "py", "gz",
    "log", "out", "png", "html", "csv", "tsv", "spm", "en", "de", "fr", "tmp", "partial",
}  # fmt: skip
# benchmarks.md is a log: it names modules and files as they were when each figure was taken.
LOG_PAGES = ("docs/benchmarks.md",)


def check_names(report: Report, text: str, rel: str) -> None:
    """Inline code naming our code, `decoding.cli.build_parser` or `engine/cache.py`, must
    name something that exists: a module (and its attribute), or a file."""
    import importlib

    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for m in re.finditer(r"(?<!`)`([^`\s]+)`(?!`)", line):
            span = m.group(1).split("::")[0].rstrip("()")
            if re.fullmatch(rf"(?:{'|'.join(PACKAGES)})/[\w/]+\.py", span):
                report.names_checked += 1
                if not (ROOT / span).is_file():
                    report.link_failures.append(f"{rel}:{n}: `{span}`: no such file")
                continue
            ours = re.fullmatch(rf"(?:{'|'.join(PACKAGES)})(?:\.\w+)+", span)
            dotted = re.fullmatch(r"[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*){2,}", span)
            if not ours and not (dotted and not span.startswith(("hydra.", "self."))):
                continue  # ours, or any `pkg.module.name` (a renamed package shows here)
            parts = span.split(".")
            if FILE_PARTS & set(parts[1:]):
                continue  # a file name (`model.safetensors`, `last.pt.damaged`)
            report.names_checked += 1
            if _is_config_key(span):
                continue  # `data.max_len`: a key (data/ is also a package)
            if parts[0] in PACKAGES and parts[0] != "benchmarks":
                parts = ["attnmt", *parts]  # `decoding.search` names attnmt.decoding.search
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    report.link_failures.append(
                        f"{rel}:{n}: `{span}`: {'.'.join(parts[:cut])} has no {attr!r}"
                    )
                break
            else:
                report.link_failures.append(f"{rel}:{n}: `{span}`: no such module")


@functools.cache
def _is_config_key(dotted: str) -> bool:
    from omegaconf import OmegaConf

    if dotted.split(".")[0] not in ("model", "data", "tokenizer", "optim", "trainer", "decoding"):
        return False
    for groups in [(), *((f"experiment={e}",) for e in _experiments())]:
        absent = object()
        if OmegaConf.select(_composed(groups), dotted, default=absent) is not absent:
            return True
    return False


def check_config_keys(report: Report) -> None:
    """docs/configuration.md names every key of every group file and every experiment."""
    import yaml

    page = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    for path in sorted((ROOT / "conf").glob("*/*.yaml")):
        group = path.parent.name
        if group == "experiment":
            report.names_checked += 1
            if f"`{path.stem}`" not in page:
                report.link_failures.append(
                    f"docs/configuration.md: experiment `{path.stem}` ({path.relative_to(ROOT)}) "
                    "is not described"
                )
            continue
        if group in ("hydra", "debug"):
            continue
        # the group's own section (`## data`), else the whole page (`## logger, hydra, debug`)
        m = re.search(rf"^## {group}\n(.*?)(?=^## |\Z)", page, re.S | re.M)
        section = m.group(1) if m else page
        keys = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key in keys:
            if key == "defaults":
                continue
            report.names_checked += 1
            if not re.search(rf"`{re.escape(key)}`|[` ]{re.escape(key)}[` (]", section):
                report.link_failures.append(
                    f"docs/configuration.md: key `{group}.{key}` ({path.relative_to(ROOT)}) "
                    f"is not in its table (## {group})"
                )


# ----------------------------------------------------------------------------- driver


def run(commands: list[Command] | None = None, links: bool = True) -> Report:
    report = Report()
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    for command in all_commands() if commands is None else commands:
        report.outcomes.append(check_command(command))
    if links:
        check_links(report)
        for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
            text, rel = _read(md)
            if rel not in LOG_PAGES:
                check_names(report, text, rel)
        check_config_keys(report)
    return report


def summary(report: Report) -> str:
    counts = Counter(o.status for o in report.outcomes)
    return (
        f"{len(report.outcomes)} commands: {counts['ok']} checked, {counts['skipped']} skipped, "
        f"{counts['failed']} failed; {report.links_checked} links and {report.names_checked} "
        f"names of code and config keys, {len(report.link_failures)} broken"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="list every command")
    args = parser.parse_args(argv)
    report = run()
    for o in report.outcomes:
        if args.verbose or o.status == "skipped":
            print(f"{o.status:8} {o.command.where()}: `{o.command.text}`: {o.detail}")
    for failure in report.failures():
        print(f"FAILED   {failure}")
    print(summary(report))
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
