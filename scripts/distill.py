#!/usr/bin/env python
"""Distil a teacher (a run, an ensemble of runs, or an imported OPUS-MT/NLLB run) into a
training corpus for a student: the teacher translates the training sources.

    python scripts/distill.py --teacher RUN [--teacher RUN2 ...] --data-dir DIR --out OUT
    python train.py experiment=multi30k_en_de_student data.dir=OUT

The command lives in `cli/distill.py` (`attnmt.cli.distill`, `attnmt-distill`).
"""

import sys

from attnmt.cli.distill import main

if __name__ == "__main__":
    sys.exit(main())
