#!/usr/bin/env python
"""Prepare a corpus once, before training (what `fairseq-preprocess` / `onmt_build_vocab` do).

    python scripts/prepare_data.py experiment=tatoeba_en_de data.dir=CORPUS_DIR
    python train.py experiment=tatoeba_en_de data.dir=CORPUS_DIR

The command lives in `cli/prepare_data.py` (`attnmt.cli.prepare_data`, `attnmt-prepare-data`).
"""

import sys

from attnmt.cli.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
