"""Optional API keys (LibreTranslate's `api_key`) and a request rate cap per key.

`serve.py --api-keys FILE`: one key per line, optionally followed by that key's cap in requests
per minute (else `--key-rate`); blank lines and lines starting with `#` are skipped. With a
key file, `POST /translate` and `POST /attention` need a listed key (in the body's `api_key`, or
an `Authorization: Bearer KEY` header): a missing or unknown key is a 403, and a key past its
cap a 429. Each key's cap is a token bucket (the cap per minute, bursts up to the cap). Keys
are held as SHA-256 digests and never logged or reported; a key is named in messages and
metrics by its line number in the file. Torch-free.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from attnmt.common.errors import UserError


class KeyRejected(Exception):
    """A request whose key is missing, unknown (403) or over its cap (429)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Bucket:
    per_minute: float
    tokens: float
    stamp: float
    line: int


class KeyRing:
    """The keys of a key file and their buckets; `check(key)` admits or raises KeyRejected."""

    def __init__(self, caps: dict[str, tuple[float, int]], clock=time.monotonic) -> None:
        # caps: key -> (requests per minute, line number)
        self._clock = clock
        now = clock()
        self._buckets = {
            _digest(key): _Bucket(rate, rate, now, line) for key, (rate, line) in caps.items()
        }
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    @classmethod
    def from_file(cls, path: str, default_rate: float) -> KeyRing:
        file = Path(path)
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--api-keys {path}: cannot read it ({e}); pass a key file") from None
        caps: dict[str, tuple[float, int]] = {}
        for number, line in enumerate(lines, 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) > 2:
                raise UserError(
                    f"--api-keys {path}, line {number}: expected KEY [REQUESTS_PER_MINUTE]; "
                    "one key per line"
                )
            rate = default_rate
            if len(words) == 2:
                try:
                    rate = float(words[1])
                except ValueError:
                    rate = -1.0
                if not rate > 0 or rate == float("inf"):
                    raise UserError(
                        f"--api-keys {path}, line {number}: the rate must be a positive number "
                        "of requests per minute"
                    )
            caps[words[0]] = (rate, number)
        if not caps:
            raise UserError(f"--api-keys {path}: no keys in it; put one key per line")
        return cls(caps)

    def check(self, key: object) -> None:
        """Admit one request with `key`, or raise KeyRejected (403 missing/unknown, 429 cap)."""
        if not isinstance(key, str) or not key:
            raise KeyRejected(403, "Invalid API key: this server needs one; send 'api_key'")
        bucket = self._buckets.get(_digest(key))
        if bucket is None:
            raise KeyRejected(403, "Invalid API key; ask the server's operator for a key")
        with self._lock:
            now = self._clock()
            refill = (now - bucket.stamp) * bucket.per_minute / 60
            bucket.tokens = min(bucket.per_minute, bucket.tokens + refill)
            bucket.stamp = now
            if bucket.tokens < 1:
                raise KeyRejected(
                    429,
                    f"Slowdown: too many requests with this key (its cap is "
                    f"{bucket.per_minute:g} per minute); retry later",
                )
            bucket.tokens -= 1


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
