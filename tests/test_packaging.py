"""attnmt installs as one package: a wheel built from the repository holds `attnmt/` and its
metadata only, works installed (not editable) from any folder, and every module of it imports
from a folder that holds a user's own `data/`, `model/`, ... packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_layout import PACKAGES, ROOT, module_name, package_files

# modules that need an optional extra (`export`: transformers, ctranslate2) at import time
OPTIONAL = {"attnmt.cli.export_check"}


def our_modules() -> list[str]:
    names = [module_name(path) for package in PACKAGES for path in package_files(package)]
    return ["attnmt", *(name for name in names if name not in OPTIONAL)]


def run(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **env}, timeout=300,
    )  # fmt: skip


IMPORT_ALL = (
    "import importlib, sys\nfor name in sys.argv[1:] or {names!r}: importlib.import_module(name)\n"
)


def test_every_module_imports_beside_a_users_own_packages(tmp_path: Path) -> None:
    for name in ["data", "model", "common", "training", "server", "engine", "checkpoint"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("OWNER = 'user'\n")
    code = IMPORT_ALL.format(names=our_modules())
    code += "import data, model, attnmt.data\n"
    code += "assert data.OWNER == model.OWNER == 'user', 'the user folder lost its packages'\n"
    code += "assert not hasattr(attnmt.data, 'OWNER')\nprint('ok')\n"
    out = run(code, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def copy_of_the_repository(into: Path) -> Path:
    skip = shutil.ignore_patterns(".*", "build", "outputs", "multirun", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, into, ignore=skip)
    return into


def test_a_clone_imports_its_own_tree(tmp_path: Path) -> None:
    """A second clone run with this environment (installed editable from the first) imports
    its own folders, not the installed ones; its shims run without any install."""
    clone = copy_of_the_repository(tmp_path / "clone")
    out = run("import attnmt.model, attnmt.cli; print(attnmt.model.__file__)", clone)
    assert out.returncode == 0 and out.stdout.strip() == str(clone / "model" / "__init__.py")
    bare = subprocess.run(
        [sys.executable, "-S", str(clone / "translate.py"), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bare.returncode == 0 and bare.stdout.startswith("usage: translate.py"), bare.stderr


WALK = """import pkgutil, sys
if sys.argv[1:] == ["--without-editable-finder"]:  # a clone without `pip install -e .`
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
import attnmt
for name in ["attnmt.tests", "attnmt.benchmarks", "attnmt.scripts", "attnmt.attnmt"]:
    try:
        __import__(name)
        print("imports", name)
    except ImportError:
        pass
for info in pkgutil.walk_packages(attnmt.__path__, "attnmt.", onerror=print):
    print(info.name)
"""


@pytest.mark.parametrize("finder", ["", "--without-editable-finder"])
def test_a_clone_holds_the_installed_packages_only(finder: str) -> None:
    """In a clone, with and without the editable install's finder, `attnmt` holds the packages
    pyproject.toml maps and nothing else: no `attnmt.tests`, and walking the package (what
    documentation generators and doctest collectors do) ends and lists our modules only."""
    out = subprocess.run(
        [sys.executable, "-c", WALK, *([finder] if finder else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    walked = out.stdout.split()
    expected = set(our_modules()) - {"attnmt"} | OPTIONAL | {"attnmt.conf"}  # conf: the YAML's
    assert set(walked) == expected, sorted(set(walked) ^ expected)[:20]


def test_the_clone_finder_maps_what_pyproject_maps() -> None:
    import tomllib

    import attnmt

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name.removeprefix("attnmt.") for name in config["package-dir"]} - {"attnmt"}
    assert set(attnmt.PACKAGES) == mapped


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources
    source = copy_of_the_repository(out / "source")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*cmd, "-w", str(out), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    return next(out.glob("attnmt-*.whl"))


def test_the_wheel_holds_attnmt_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"attnmt", "attnmt-0.1.0.dist-info"}
    configs = {f"attnmt/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs <= set(names), configs - set(names)  # every config group travels
    assert "attnmt/server/static/index.html" in names
    assert "attnmt-0.1.0.dist-info/licenses/LICENSE" in names
    entry_points = zipfile.ZipFile(wheel).read("attnmt-0.1.0.dist-info/entry_points.txt")
    for command in [
        "train",
        "translate",
        "serve",
        "export",
        "import-hf",
        "average",
        "distill",
        "score",
    ]:
        assert f"attnmt-{command} = ".encode() in entry_points


def test_the_wheel_works_installed(wheel: Path, tmp_path: Path) -> None:
    """Installed into a folder of its own, not editable: imported from there, every module
    loads, Hydra finds the configs inside the package, and the console commands run."""
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    installed = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    code = IMPORT_ALL.format(names=our_modules())
    code += "import attnmt.model; print(attnmt.model.__file__)\n"
    out = run(code, tmp_path, PYTHONPATH=str(site))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site / "attnmt" / "model")), out.stdout
    env = {**os.environ, "PYTHONPATH": str(site)}
    job = subprocess.run(
        [sys.executable, str(site / "bin" / "attnmt-train"), "--cfg", "job", "model=base"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert job.returncode == 0 and "d_model: 512" in job.stdout, job.stderr[-2000:]
    bad = subprocess.run(
        [sys.executable, str(site / "bin" / "attnmt-translate"), "-c", "missing", "x"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.startswith("attnmt-translate: error:"), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
