#!/usr/bin/env python
"""Import a pretrained model from Hugging Face Transformers: OPUS-MT or NLLB-200 / M2M100.

    python scripts/import_hf.py path/to/opus-mt-en-de --out runs/opus-en-de
    python scripts/import_hf.py Helsinki-NLP/opus-mt-en-de --out runs/opus-en-de   # Hub name
    python scripts/import_hf.py path/to/nllb --out runs/nllb --src-lang eng_Latn --tgt-lang deu_Latn

The command lives in `cli/import_hf.py` (`attnmt.cli.import_hf`, `attnmt-import-hf`).
"""

import sys

from attnmt.cli.import_hf import main

if __name__ == "__main__":
    sys.exit(main())
