"""uvicorn's HTTP/1.1 protocol (h11) with a deadline on a request's head.

uvicorn closes a connection idle after an answer (`timeout_keep_alive`) and bounds a head's
size (h11: 16 KiB), but not the time it takes to send one: a client that sends half a head
and waits holds its connection forever. Here a connection that has not sent a whole request
head `header_timeout` seconds after it opened, or after its last answer, is closed. The body
has its own deadline (`handling.read_bytes`). Torch-free; imports uvicorn (serve.py's).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class TimedH11Protocol(H11Protocol):
    """`H11Protocol` whose connections close when a request head is late (module docstring)."""

    header_timeout = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._waiting_for_head():
            return
        self._disarm()  # a request is in: its body and answer have deadlines of their own

    def on_response_complete(self) -> None:
        self._arm()  # before: the call below may start a pipelined request (and disarm)
        super().on_response_complete()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()


def timed_protocol(header_timeout: float) -> Any:
    """The protocol class for uvicorn's `http`, closing connections whose head is late."""
    return type("TimedH11Protocol", (TimedH11Protocol,), {"header_timeout": header_timeout})
