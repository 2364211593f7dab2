#!/usr/bin/env python
"""Translate with a trained checkpoint: sentences as arguments, from a file, or from stdin.

    python translate.py -c RUN_DIR "A man rides a bike." "Two dogs play in the snow."
    echo "A man rides a bike." | python translate.py -c RUN_DIR
    python translate.py -c RUN_DIR --input test.en --output hyp.de --ref test.de --beam 5
    python translate.py -c RUN_DIR --plot-attention attn.png "A man rides a bike."
    python translate.py -c RUN_DIR --quantize int8 --device cpu --input test.en

(RUN_DIR: a run of the default experiment, English -> German.)

One translation per input line, in order (an empty line gives an empty line), written as the
input is read: a file `--buffer-size` lines at a time, a pipe or terminal line by line. Every
user mistake ends with one line on stderr, `translate.py: error: <problem>; <fix>`, and exit
status 1 (2 for bad flags), never a traceback. The command lives in `cli/translate.py`
(`attnmt.cli.translate`, `attnmt-translate`).
"""

import sys

from attnmt.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
