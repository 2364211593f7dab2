#!/usr/bin/env python
"""Average the weights of several checkpoints into one (Vaswani et al. 2017, sec. 6.1).

    python scripts/average_checkpoints.py --run-dir RUN --last 5 --output RUN/checkpoints/avg5.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt
    python translate.py -c RUN/checkpoints/avg5.pt --input test.de

The command lives in `cli/average.py` (`attnmt.cli.average`, `attnmt-average`).
"""

import sys

from attnmt.cli.average import main

if __name__ == "__main__":
    sys.exit(main())
