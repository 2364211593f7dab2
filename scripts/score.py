#!/usr/bin/env python
"""Score translations: sacreBLEU BLEU and chrF, and the Transformer paper's tokenized,
compound-split BLEU.

    python scripts/score.py --hyp RUN/hyp.newstest2014.de --ref WMT14/newstest2014.de

The command lives in `cli/score.py` (`attnmt.cli.score`).
"""

import sys

from attnmt.cli.score import main

if __name__ == "__main__":
    sys.exit(main())
