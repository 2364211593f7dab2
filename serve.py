#!/usr/bin/env python
"""Serve translations over HTTP, with a page that shows what the model attends to.

    python serve.py -c RUN_DIR                       # http://127.0.0.1:8000
    python serve.py -c RUN_DIR --port 8080 --beam 1  # greedy by default
    curl -s localhost:8000/translate -d '{"sentences": ["A man rides a bike."], "beam_size": 5}'

The model is loaded once; requests that arrive together are translated in one batch on one
model thread. SIGTERM or Ctrl-C answers the requests already received, then exits 0. The API,
its options, limits and errors are in docs/serving.md; the command in `cli/serve.py`
(`attnmt.cli.serve`, `attnmt-serve`).
"""

import sys

from attnmt.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
