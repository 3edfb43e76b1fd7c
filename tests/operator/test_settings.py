"""The operator refuses, at start-up and with a usage error, settings it cannot run with."""

from __future__ import annotations

import pytest

from embedfleet.common.settings import load
from embedfleet.operator.settings import ENV_PREFIX, OperatorSettings


@pytest.mark.parametrize(
    ("flag", "value"), [("--reconcile-workers", "0"), ("--autoscaler-status-seconds", "-1")]
)
def test_a_setting_below_its_minimum_is_a_usage_error(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        load(OperatorSettings, ENV_PREFIX, argv=[flag, value], env={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: " in err
    assert "below the minimum" in err
