#!/usr/bin/env python
"""Export a trained model to Hugging Face Transformers or to CTranslate2.

    python scripts/export.py hf  -c RUN_DIR -o model-hf      # MarianMTModel + MarianTokenizer
    python scripts/export.py ct2 -c RUN_DIR -o model-ct2     # ctranslate2.Translator
    python scripts/export.py ct2 -c RUN_DIR/checkpoints/best.pt -o model-int8 --quantization int8

The command lives in `cli/export.py` (`attnmt.cli.export`, `attnmt-export`).
"""

import sys

from attnmt.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
