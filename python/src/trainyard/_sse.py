"""Server-sent events, read from a byte stream as the specification says (lines end in CRLF, LF or CR)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    """The event's type; ``message`` when it named none."""
    data: list[str]
    """Its ``data:`` fields, in order."""


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a byte stream, each without its ending, split on CRLF, LF and CR only (unlike
    ``str.splitlines``, which also splits on form feeds and Unicode separators a log line may hold)."""
    buf = bytearray()
    skip_lf = False  # the previous chunk ended in CR: a LF first in this one belongs to that ending
    for chunk in chunks:
        start = 0
        if skip_lf and chunk[:1] == b"\n":
            start = 1
        skip_lf = False
        i = start
        n = len(chunk)
        while i < n:
            c = chunk[i]
            if c == 0x0A or c == 0x0D:
                buf += chunk[start:i]
                yield buf.decode("utf-8", errors="replace")
                buf.clear()
                if c == 0x0D:
                    if i + 1 < n:
                        if chunk[i + 1] == 0x0A:
                            i += 1
                    else:
                        skip_lf = True
                start = i + 1
            i += 1
        buf += chunk[start:]
    if buf:
        yield buf.decode("utf-8", errors="replace")


def events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a stream's lines; comments (keep-alives) and events without data are skipped."""
    event = ""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield SseEvent(event=event or "message", data=data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    # An event the stream ended in the middle of is not dispatched (as the specification says).
