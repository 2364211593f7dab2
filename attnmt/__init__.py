"""attnmt: the Transformer for machine translation, complete and readable.

One import name over the repository's folders (pyproject.toml maps each): `attnmt.model` (the
paper's model), `attnmt.data` (corpora, tokenizers, batches), `attnmt.checkpoint`,
`attnmt.engine` (inference beside the model), `attnmt.decoding` (search, translation),
`attnmt.exporting`, `attnmt.training`, `attnmt.evaluation`, `attnmt.server`, and `attnmt.cli`,
the command line over all of them. docs/architecture.md draws the layers.
"""

from pathlib import Path

__version__ = "0.1.0"

# In a clone, the subpackages are the folders beside this one. Installed (a wheel, or `pip
# install -e .`), pyproject.toml's mapping finds them; a clone run without that install (the
# shims `python translate.py`, ...) finds them here, in its own tree and never in another
# clone's install.
_CLONE = Path(__file__).resolve().parent.parent
if (_CLONE / "pyproject.toml").is_file() and (_CLONE / "cli" / "__init__.py").is_file():
    __path__.append(str(_CLONE))
