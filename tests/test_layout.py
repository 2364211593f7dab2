"""The package layout as docs/architecture.md states it: which package may import which
(parsed from every import statement, also those inside functions), no `sys.path` edits, and
inference that never imports training or `datasets`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = {"common", "model", "data", "checkpoint", "engine", "decoding", "exporting", "evaluation"}
OURS |= {"training", "benchmarks", "server"}

# package -> the packages of ours it may import (docs/architecture.md, "Packages")
ALLOWED = {
    "common": set(),
    "model": set(),
    "evaluation": set(),
    "data": {"common"},
    "checkpoint": {"common", "model", "data"},
    "engine": {"common", "model", "data", "checkpoint", "decoding"},
    "decoding": {"common", "model", "data", "checkpoint", "engine", "evaluation"},
    "exporting": {"common", "model", "data", "checkpoint", "decoding"},
    "training": {"common", "model", "data", "checkpoint", "engine", "decoding", "evaluation"},
    "server": {"common", "data", "checkpoint", "engine", "decoding", "evaluation"},
}
# engine implements decoding's search core; the rest of decoding loads models through engine
ENGINE_MAY_IMPORT = {"decoding.config", "decoding.search", "decoding.ensemble"}


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


def test_packages_import_only_what_the_layout_allows() -> None:
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in package_files(package):
            for name in imports_of(path):
                top = name.split(".")[0]
                if top in OURS and top != package and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_engine_imports_only_the_search_core_of_decoding() -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package_files("engine")
        for name in imports_of(path)
        if name.startswith("decoding.") and ".".join(name.split(".")[:2]) not in ENGINE_MAY_IMPORT
    ]
    assert not wrong, "\n".join(wrong)


def test_inference_never_imports_training_or_datasets() -> None:
    """What translate.py and serve.py load, loaded: neither `training` nor `datasets` (~1 s to
    import)."""
    modules = "decoding.cli, decoding.translator, decoding.plot, engine, checkpoint, exporting"
    modules += ", server.cli, server.app"
    code = f"import sys, {modules}; print(sorted({{m.split('.')[0] for m in sys.modules}}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout))
    assert {"decoding", "engine", "model"} <= loaded
    assert not loaded & {"training", "datasets"}


def test_nothing_edits_sys_path() -> None:
    python_files = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts]
    found = [str(p.relative_to(ROOT)) for p in python_files if "sys.path." in p.read_text()]
    assert found == [f"tests/{Path(__file__).name}"], found
