#!/usr/bin/env python
"""Where glossary terms land: term use, glued terms, terms after the final mark, a term beside
the usual word, WMT 2021's window overlap and BLEU, with and without glossaries.

    python scripts/term_eval.py --run RUN_DIR --src test2017.en --ref test2017.de --out DIR

The command lives in `cli/term_eval.py` (`attnmt.cli.term_eval`).
"""

import sys

from attnmt.cli.term_eval import main

if __name__ == "__main__":
    sys.exit(main())
