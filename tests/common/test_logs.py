"""common/logs.py: JSON or text lines as chosen, and the limiter (one line per interval, the
held-back count in the next)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from embedfleet.common import logs
from embedfleet.common.logs import LogLimiter


def test_one_line_per_interval_with_the_count_held_back() -> None:
    limiter = LogLimiter(10.0)
    assert limiter.allow(0.0) == 0
    assert [limiter.allow(t) for t in (1.0, 5.0, 9.9)] == [None, None, None]
    assert limiter.allow(10.0) == 3  # the three held back since the last line
    assert limiter.allow(12.0) is None
    assert limiter.allow(25.0) == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.mark.usefixtures("restore_root")
@pytest.mark.parametrize(
    ("stream", "log_format", "json_lines"),
    [
        (io.StringIO(), "auto", True),  # a pipe or a file: for machines
        (_Terminal(), "auto", False),  # a person
        (_Terminal(), "json", True),
        (io.StringIO(), "text", False),
    ],
)
def test_format_follows_the_choice_and_the_terminal(
    stream: io.StringIO, log_format: str, json_lines: bool
) -> None:
    logs.configure("info", stream, log_format)
    logging.getLogger("embedfleet.x").info("loading weights", extra={"bytes": 90})
    line = stream.getvalue().strip()
    if json_lines:
        assert json.loads(line) | {"ts": 0} == {
            "ts": 0,
            "level": "info",
            "logger": "embedfleet.x",
            "msg": "loading weights",
            "bytes": 90,
        }
    else:
        assert line.endswith(" info    embedfleet.x: loading weights  bytes=90")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log format 'plain'"):
        logs.is_json("plain")
