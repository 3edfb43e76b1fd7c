"""The crate's own tests (cargo test: the decisions behind what the black-box tests see, such as
chunk planning, balancing, admission's estimate, tokenization against known ids) as part of the
pytest run: the executables `cargo test` builds, cached by content
(embedfleet.testing.cargo_tests)."""

from __future__ import annotations

from embedfleet.testing.cargo_tests import run_tests


def test_cargo_test_passes() -> None:
    run = run_tests()
    names = {name for name, _, _ in run.results}
    # the gateway library's and the shared logs crate's unit tests and the two integration
    # tests (contract, layers), at least
    wanted = {"lib-embedfleet_gateway", "lib-embedfleet_logs", "test-contract", "test-layers"}
    assert wanted <= names, names
    assert run.passed, run.output()[-12000:]
    for name, _, out in run.results:
        assert "test result: ok." in out, (name, out[-3000:])
        assert " 0 failed" in out, (name, out[-3000:])
