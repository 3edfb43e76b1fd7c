"""The soak benchmark's figure (bench/soak.py `growth`), from made-up samples."""

from __future__ import annotations

import pytest

from embedfleet.bench.soak import growth


def test_growth_compares_minute_medians_not_single_samples() -> None:
    # A steady worker whose samples swing by a batch's working set, and one that grows.
    samples = [
        (float(t), {"steady": 800.0 + (300.0 if t % 20 == 0 else 0.0), "leaky": 800.0 + t})
        for t in range(0, 301, 5)
    ]
    rows = {g.process: g for g in growth(samples)}
    steady, leaky = rows["steady"], rows["leaky"]
    assert steady.growth == pytest.approx(0.0)
    assert steady.peak_mb == 1100.0
    assert steady.last_floor_mb == 800.0
    # Medians of [60, 120] and [240, 300]: 890 and 1070.
    assert leaky.second_minute_mb == 890.0
    assert leaky.last_minute_mb == 1070.0
    assert leaky.growth == pytest.approx(180 / 890)


def test_growth_needs_two_minutes() -> None:
    with pytest.raises(ValueError, match="two minutes"):
        growth([(0.0, {"w": 1.0}), (90.0, {"w": 1.0})])
