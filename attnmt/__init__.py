"""attnmt: the Transformer for machine translation, complete and readable.

One import name over the repository's folders (pyproject.toml maps each): `attnmt.model` (the
paper's model), `attnmt.data` (corpora, tokenizers, batches), `attnmt.checkpoint`,
`attnmt.engine` (inference beside the model), `attnmt.decoding` (search, translation),
`attnmt.exporting`, `attnmt.training`, `attnmt.evaluation`, `attnmt.server`, and `attnmt.cli`,
the command line over all of them. docs/architecture.md draws the layers.
"""

__version__ = "0.1.0"
