"""The package layout as docs/architecture.md states it, parsed from every import statement (also
those inside functions): one import name (`attnmt`), layers that import only downwards, no
import circles, a command-line layer no library module imports, inference that never imports
training or `datasets`, no `sys.path` edits, and the size limits the layout keeps."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ["common", "model", "evaluation", "data", "checkpoint", "decoding", "engine"]
LIBRARY += ["exporting", "training", "server"]
PACKAGES = [*LIBRARY, "cli"]

# package -> the packages of ours it may import (docs/architecture.md, "Packages"); the
# command-line layer (`cli`) may import any, and no package imports it.
ALLOWED = {
    "common": set(),
    "model": set(),
    "evaluation": set(),
    "data": {"common"},
    "checkpoint": {"common", "model", "data"},
    "decoding": {"common", "model", "data", "checkpoint", "evaluation"},
    "engine": {"common", "model", "data", "checkpoint", "decoding"},
    "exporting": {"common", "model", "data", "checkpoint", "decoding"},
    "training": {"common", "model", "data", "checkpoint", "engine", "decoding", "evaluation"},
    "server": {"common", "data", "checkpoint", "engine", "decoding", "evaluation"},
    "cli": set(LIBRARY),
}
# engine implements decoding's search core; the rest of decoding never loads the engine
ENGINE_MAY_IMPORT = {"attnmt.decoding.config", "attnmt.decoding.search", "attnmt.decoding.ensemble"}
# The command-line layer and the repository's own tools (not installed) around the package.
OUTSIDE = [*sorted(ROOT.glob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
OUTSIDE += sorted((ROOT / "benchmarks").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    """Every module name `path` imports (absolute imports only: the tree has no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(["attnmt", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def package_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "attnmt" else None


def test_every_import_of_ours_is_under_attnmt() -> None:
    """No module imports a bare `model`, `data`, ...: a user's own folder of that name would
    shadow it, or be shadowed. No relative imports either: every import names its layer."""
    files = [p for package in PACKAGES for p in package_files(package)] + OUTSIDE
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imports_of(path)
        if name.split(".")[0] in PACKAGES
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports relatively")
    assert not wrong, "\n".join(wrong)


def test_packages_import_only_what_the_layout_allows() -> None:
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in package_files(package):
            for name in imports_of(path):
                other = package_of(name)
                if other and other != package and other not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_engine_imports_only_the_search_core_of_decoding() -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package_files("engine")
        for name in imports_of(path)
        if name.startswith("attnmt.decoding.")
        and ".".join(name.split(".")[:3]) not in ENGINE_MAY_IMPORT
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_import_circles() -> None:
    """Between modules of one package too (e.g. an app and its OpenAPI document)."""
    modules = {module_name(p): p for package in PACKAGES for p in package_files(package)}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imports_of(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                # a package's __init__ re-exporting its modules is not a circle
                if not imported.startswith(name + "."):
                    graph[name].add(imported)
    circles, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "\n".join(circles)


def test_only_the_commands_import_the_command_line_layer() -> None:
    """`attnmt.cli` is argument parsing over the library: only cli/ itself, the shims at the
    top and in scripts/, and tests (for the commands' `main`) import it; the library,
    benchmarks/ and examples/ import what the commands call from the library."""
    allowed = [ROOT / "cli", ROOT / "scripts", ROOT / "tests"]
    files = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and p.parent != ROOT]
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        if not any(path.is_relative_to(folder) for folder in allowed)
        for name in imports_of(path)
        if name == "attnmt.cli" or name.startswith("attnmt.cli.")
    ]
    assert not wrong, "\n".join(wrong)


def test_no_library_function_takes_an_argparse_namespace() -> None:
    """The library takes typed options (frozen dataclasses the commands build from their
    flags), never a parser's `argparse.Namespace`; nor does a spawned model process, whose
    code is the library's (no command starts one)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{node.lineno} starts a ModelProcess"
        for path in package_files("cli")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("ModelProcess")
    ]
    for path in (p for package in LIBRARY for p in package_files(package)):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            params += [p for p in (node.args.vararg, node.args.kwarg) if p is not None]
            for param in params:
                if param.annotation is not None and "Namespace" in ast.unparse(param.annotation):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({param.arg})")
    assert not wrong, "\n".join(wrong)


def test_inference_never_imports_training_or_datasets() -> None:
    """What translate.py and serve.py load, loaded: neither `training` nor `datasets` (~1 s to
    import)."""
    modules = "attnmt.cli.translate, attnmt.cli.serve, attnmt.decoding.translator"
    modules += ", attnmt.decoding.plot, attnmt.engine, attnmt.checkpoint, attnmt.exporting"
    modules += ", attnmt.server.app"
    code = f"import sys, {modules}; print(sorted({{m.split('.')[0] for m in sys.modules}}))"
    code += "; print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('attnmt.')}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    top, ours = (set(ast.literal_eval(line)) for line in out.stdout.splitlines())
    assert {"decoding", "engine", "model"} <= ours and "datasets" not in top
    assert "training" not in ours


def test_nothing_edits_sys_path() -> None:
    python_files = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts]
    found = [str(p.relative_to(ROOT)) for p in python_files if "sys.path." in p.read_text()]
    assert found == [f"tests/{Path(__file__).name}"], found


# The shape's caps, as docs/architecture.md states them (`test_the_docs_state_the_caps`). They
# are fixed by the layout decision, not by the code: a change that does not fit is cut to fit,
# and a cap is never raised in the commit that needs it.
CAPS = {"function": 100, "model/": 800, "benchmarks/": 1500, "docs/benchmarks.md": 500, "shim": 40}


def test_the_docs_state_the_caps() -> None:
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    assert (
        f"no function over {CAPS['function']} lines, `model/` at most {CAPS['model/']:,} lines, "
        f"`benchmarks/` at most {CAPS['benchmarks/']:,}, docs/benchmarks.md at most "
        f"{CAPS['docs/benchmarks.md']:,}, shims at most {CAPS['shim']}."
    ) in text


def test_no_function_is_over_100_lines() -> None:
    files = [p for package in PACKAGES for p in package_files(package)]
    files += [p for p in OUTSIDE if "tests" not in p.relative_to(ROOT).parts]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > CAPS["function"]:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert not long, "\n".join(long)


def lines_in(folder: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / folder).rglob("*.py"))


def test_the_model_is_the_paper_and_the_benchmarks_are_reports() -> None:
    """model/ stays readable beside nanoGPT's 330 lines; benchmarks/ is one harness and its
    plug-ins (the systems, the server's load, the training step, fine-tuning an import);
    docs/benchmarks.md holds today's figures."""
    assert lines_in("model") <= CAPS["model/"]
    assert lines_in("benchmarks") <= CAPS["benchmarks/"]
    benchmarks_md = ROOT / "docs" / "benchmarks.md"
    assert len(benchmarks_md.read_text().splitlines()) <= CAPS["docs/benchmarks.md"]


def test_shims_are_short_and_call_the_command_line_layer() -> None:
    shims = [ROOT / "train.py", ROOT / "translate.py", ROOT / "serve.py"]
    shims += sorted((ROOT / "scripts").glob("*.py"))
    for shim in shims:
        text = shim.read_text()
        assert len(text.splitlines()) <= CAPS["shim"], shim
        assert "from attnmt.cli." in text, shim


README_CAP = 250  # the door: what attnmt is, how to train and test; details live in docs/


def test_the_readme_is_a_door() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_CAP, (
        f"README.md has {lines} lines (cap {README_CAP}): move details to docs/"
    )
