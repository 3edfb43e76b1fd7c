"""Fixtures of the autoscaler's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from embedfleet.testing.stub_worker import StubWorker


@pytest.fixture
def stub_workers() -> Iterator[list[StubWorker]]:
    """Started on demand through `start_stub`; all stopped after the test."""
    started: list[StubWorker] = []
    yield started
    for stub in started:
        stub.stop()
