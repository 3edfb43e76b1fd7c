"""The log limiter (common/logs.py): one line per interval, the held-back count in the next."""

from __future__ import annotations

from embedfleet.common.logs import LogLimiter


def test_one_line_per_interval_with_the_count_held_back() -> None:
    limiter = LogLimiter(10.0)
    assert limiter.allow(0.0) == 0
    assert [limiter.allow(t) for t in (1.0, 5.0, 9.9)] == [None, None, None]
    assert limiter.allow(10.0) == 3  # the three held back since the last line
    assert limiter.allow(12.0) is None
    assert limiter.allow(25.0) == 1
