#!/usr/bin/env python
"""Prepare a corpus once, before training (what `fairseq-preprocess` / `onmt_build_vocab` do).

    python scripts/prepare_data.py experiment=tatoeba_en_de data.dir=CORPUS_DIR
    python train.py experiment=tatoeba_en_de data.dir=CORPUS_DIR

Takes the same Hydra overrides as `train.py` and runs its data stages: load the corpus into
Arrow, filter the training pairs, train SentencePiece (or find the model trained earlier with
the same corpus and settings), encode every split. Everything lands in the data cache
(`data.cache_dir`, else `$ATTNMT_CACHE`, else `~/.cache/attnmt`), keyed by content and settings,
so a later `train.py` with the same `data.*` and `tokenizer.*` settings, on one rank or many,
finds it and starts training in seconds. Run it on a filesystem every node sees when training
on several nodes. Overrides of other groups (model, trainer, ...) are accepted and ignored.
"""

from __future__ import annotations

import logging
import sys

from attnmt.cli.args import program_name
from attnmt.common.errors import UserError
from attnmt.training.prepare import prepare_corpus

PROG = program_name("prepare_data.py")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        report = prepare_corpus(argv)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
