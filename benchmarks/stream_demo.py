#!/usr/bin/env python
"""Show translate.py translating a pipe line by line: send one line, wait for its translation,
then send the next, with timestamps (seconds since translate.py was started).

    python -m benchmarks.stream_demo SENTENCES_FILE -c RUN_DIR [more translate.py flags]
    python -m benchmarks.stream_demo test2016.en -c RUN_DIR --lines 5

Every translate.py flag after the file is passed on (`-c` is required). Each "got" line
arrives while translate.py's stdin is still open, before the next line is sent: the proof that
a line is translated as soon as it arrives. Exits 1 if a translation does not come within
`--timeout` seconds.
"""

from __future__ import annotations

import argparse
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sentences", help="file of sentences, one per line")
    parser.add_argument("--lines", type=int, default=5, help="send the first N lines (5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per line (120)")
    args, translate_args = parser.parse_known_args(argv)
    try:
        with open(args.sentences, encoding="utf-8") as f:
            sentences = [line.rstrip("\n") for _, line in zip(range(args.lines), f, strict=False)]
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"cannot read sentences from {args.sentences} ({e}); pass a text file first")

    command = [sys.executable, str(ROOT / "translate.py"), *translate_args]
    start = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - start:7.3f} s] {text}", flush=True)

    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    say("started: translate.py " + " ".join(translate_args) + "  (stdin and stdout are pipes)")
    received: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [received.put(x) for x in proc.stdout], daemon=True).start()
    try:
        for i, sentence in enumerate(sentences, 1):
            proc.stdin.write(f"{sentence}\n".encode())
            proc.stdin.flush()
            say(f"sent {i}: {sentence}")
            try:
                translation = received.get(timeout=args.timeout).decode().rstrip("\n")
            except queue.Empty:
                say(f"no translation of line {i} within {args.timeout:g} s")
                return 1
            alive = "running, stdin open" if proc.poll() is None else f"exited {proc.poll()}"
            say(f"got  {i}: {translation}   [translate.py {alive}]")
        proc.stdin.close()
        say(f"closed stdin; translate.py exited with status {proc.wait(timeout=args.timeout)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
