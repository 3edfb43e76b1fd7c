"""Logging shared by every component: JSON lines for machines, text lines for people.

`json`: one object per record (timestamp, level, logger, message and any `extra=` fields). `text`:
`HH:MM:SS level logger: message key=value ...`. `auto` (the default) writes text where stderr is a
terminal and JSON elsewhere. Callers pass counts, timings and ids in `extra`, never request text or
secrets.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any, Literal, TextIO, get_args

LogFormat = Literal["auto", "json", "text"]
#: the choices of every component's --log-format (the gateway's too)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

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
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's `extra=` fields."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """One readable line per record (and the traceback of one that carries it)."""

    def __init__(self) -> None:
        super().__init__(datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{self.formatTime(record, self.datefmt)} {record.levelname.lower():<7} "
        line += f"{record.name}: {record.getMessage()}" + (f"  {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def is_json(log_format: str, stream: TextIO | None = None) -> bool:
    """Whether `log_format` writes JSON lines to `stream` (stderr): auto does unless it is a
    terminal."""
    if log_format == "auto":
        out = stream or sys.stderr
        return not (hasattr(out, "isatty") and out.isatty())
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; use one of {list(LOG_FORMATS)}")
    return log_format == "json"


def configure(level: str, stream: TextIO | None = None, log_format: str = "auto") -> None:
    """Route the root logger to `stream` (stderr) at `level`, as `log_format` says."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if is_json(log_format, out) else TextFormatter())
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
