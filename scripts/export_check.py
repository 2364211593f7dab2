#!/usr/bin/env python
"""How often the exported models' greedy outputs equal ours, on a real test set.

    python scripts/export_check.py -c RUN_DIR --src test2016.en
    python scripts/export_check.py -c RUN_DIR --src test2016.en --ref test2016.de --limit 200

The command lives in `cli/export_check.py` (`attnmt.cli.export_check`, `attnmt-export-check`).
"""

import sys

from attnmt.cli.export_check import main

if __name__ == "__main__":
    sys.exit(main())
