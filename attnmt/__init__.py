"""attnmt: the Transformer for machine translation, complete and readable.

One import name over the repository's folders (pyproject.toml maps each): `attnmt.model` (the
paper's model), `attnmt.data` (corpora, tokenizers, batches), `attnmt.checkpoint`,
`attnmt.engine` (inference beside the model), `attnmt.decoding` (search, translation),
`attnmt.exporting`, `attnmt.training`, `attnmt.evaluation`, `attnmt.server`, and `attnmt.cli`,
the command line over all of them. docs/architecture.md draws the layers.
"""

import sys
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path

__version__ = "0.1.0"

# The folders pyproject.toml's [tool.setuptools.package-dir] maps under `attnmt`, and only
# those (tests/test_packaging.py checks the two lists agree): a clone's tests/, benchmarks/
# and scripts/ are no part of the package.
PACKAGES = ("common", "model", "data", "checkpoint", "engine", "decoding", "exporting")
PACKAGES += ("training", "evaluation", "server", "cli", "conf")


class _CloneFolders:
    """The path entry that finds `attnmt.<package>` in a clone's folder `<package>/`, and lists
    exactly those packages (what `pkgutil.walk_packages(attnmt.__path__)` walks)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, target: object = None) -> ModuleSpec | None:
        parent, _, name = fullname.rpartition(".")
        init = self.root / name / "__init__.py"
        if parent != __name__ or name not in PACKAGES or not init.is_file():
            return None
        return spec_from_file_location(
            fullname, init, submodule_search_locations=[str(self.root / name)]
        )

    def iter_modules(self, prefix: str = ""):  # what pkgutil.iter_modules asks a path entry
        return [(prefix + name, True) for name in PACKAGES if (self.root / name).is_dir()]

    def invalidate_caches(self) -> None:
        pass


def _clone_hook(entry: str) -> _CloneFolders:
    root, found, _ = entry.partition(_CLONE_ENTRY)
    if not found or not (Path(root) / "pyproject.toml").is_file():
        raise ImportError(entry)  # not ours: the next path hook answers
    return _CloneFolders(Path(root))


# In a clone, the subpackages are the folders beside this one. Installed (a wheel, or `pip
# install -e .`), pyproject.toml's mapping finds them; a clone run without that install (the
# shims `python translate.py`, ...) finds them through one entry of `__path__` that names its
# own tree (never another clone's install) and answers for the mapped folders only.
_CLONE_ENTRY = "#attnmt-packages"
_ROOT = Path(__file__).resolve().parent.parent
if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "cli" / "__init__.py").is_file():
    if not any(getattr(hook, "__qualname__", "") == "_clone_hook" for hook in sys.path_hooks):
        sys.path_hooks.append(_clone_hook)
    __path__.append(str(_ROOT) + _CLONE_ENTRY)
