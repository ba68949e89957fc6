"""Server-sent events, read from a byte stream as the specification says (lines end in CRLF, LF or CR).

The readers are fed what arrives and hand back what is whole, so that a blocking stream and an async one read
alike; :func:`split_lines` and :func:`events` are the same over an iterable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    """The event's type; ``message`` when it named none."""
    data: list[str]
    """Its ``data:`` fields, in order."""


@dataclass(slots=True)
class LineSplitter:
    """A byte stream's lines, each without its ending, split on CRLF, LF and CR only (unlike
    ``str.splitlines``, which also splits on form feeds and Unicode separators a log line may hold)."""

    _buf: bytearray = field(default_factory=bytearray)
    _skip_lf: bool = False
    """The previous chunk ended in CR: a LF first in the next one belongs to that ending."""

    def feed(self, chunk: bytes) -> list[str]:
        """The lines this chunk ends."""
        out: list[str] = []
        if not chunk:
            return out
        start = 1 if self._skip_lf and chunk[:1] == b"\n" else 0
        self._skip_lf = False
        i = start
        n = len(chunk)
        while i < n:
            c = chunk[i]
            if c == 0x0A or c == 0x0D:
                self._buf += chunk[start:i]
                out.append(self._buf.decode("utf-8", errors="replace"))
                self._buf.clear()
                if c == 0x0D:
                    if i + 1 < n:
                        if chunk[i + 1] == 0x0A:
                            i += 1
                    else:
                        self._skip_lf = True
                start = i + 1
            i += 1
        self._buf += chunk[start:]
        return out

    def end(self) -> list[str]:
        """The last line, when the stream ended without a line break after it."""
        if not self._buf:
            return []
        last = self._buf.decode("utf-8", errors="replace")
        self._buf.clear()
        return [last]


@dataclass(slots=True)
class EventReader:
    """Events from a stream's lines; comments (keep-alives) and events without data are skipped. An event the
    stream ends in the middle of is never handed back (as the specification says)."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> SseEvent | None:
        """The event this line ends (an empty line ends one), if any."""
        if line == "":
            ev = SseEvent(event=self._event or "message", data=self._data) if self._data else None
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a byte stream (see :class:`LineSplitter`)."""
    splitter = LineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


def events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a stream's lines (see :class:`EventReader`)."""
    reader = EventReader()
    for line in lines:
        ev = reader.feed(line)
        if ev is not None:
            yield ev
