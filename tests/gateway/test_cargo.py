"""The crate's own tests (cargo test: the decisions behind what the black-box tests see, such as
chunk planning, balancing, admission's estimate, tokenization against known ids) as part of the
pytest run."""

from __future__ import annotations

from embedfleet.testing.gateway import cargo_test


def test_cargo_test_passes() -> None:
    proc = cargo_test()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert " 0 failed" in proc.stdout
    assert "test result: ok." in proc.stdout
