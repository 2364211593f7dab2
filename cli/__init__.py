"""The command-line layer: one module per command, each a console script of its own
(`attnmt-train`, `attnmt-translate`, `attnmt-serve`, `attnmt-export`, `attnmt-export-check`,
`attnmt-import-hf`, `attnmt-average`, `attnmt-prepare-data`) and a shim at the repository root
or in `scripts/`. Commands import the library; the library never imports a command."""
