"""JSON-lines logging shared by every component.

One object per record: timestamp, level, logger, message and any `extra=` fields. Callers pass
counts, timings and ids in `extra`, never request text or secrets.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any, TextIO

# Attributes every LogRecord has; anything else came through `extra=` and is logged as a field.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            # Epoch seconds: sortable, comparable with time.time(), parsed by every log shipper.
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str, stream: TextIO | None = None) -> None:
    """Route the root logger to `stream` (stderr) as JSON lines at `level`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@dataclass(slots=True)
class LogLimiter:
    """Lets one line through per `seconds` and counts those held back in between: for a line
    that a client or an outage can cause at any rate (a malformed message per call, a failed write
    per fleet per tick), which would otherwise flood the log and its shipper."""

    seconds: float
    _next: float = -math.inf
    _held: int = 0

    def allow(self, now: float) -> int | None:
        """The count held back since the last one let through, or None to stay quiet."""
        if now < self._next:
            self._held += 1
            return None
        held, self._held, self._next = self._held, 0, now + self.seconds
        return held
