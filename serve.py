#!/usr/bin/env python
"""Serve translations over HTTP, with a page that shows what the model attends to.

    python serve.py -c RUN_DIR                       # http://127.0.0.1:8000
    python serve.py -c RUN_DIR --port 8080 --beam 1  # greedy by default
    curl -s localhost:8000/translate -d '{"sentences": ["A man rides a bike."], "beam_size": 5}'

The model is loaded once; requests that arrive together are translated in one batch on one
model thread. SIGTERM or Ctrl-C answers the requests already received, then exits 0. The API,
its options, limits and errors are in docs/serving.md; the flags and the run in `server/cli.py`.
"""

from __future__ import annotations

import sys

from server.cli import main

if __name__ == "__main__":
    sys.exit(main())
