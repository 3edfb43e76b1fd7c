from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from embedfleet.common.settings import SettingsError, from_namespace, load, markdown_table, setting


@dataclass(frozen=True)
class Demo:
    port: int = setting(8080, "Port.")
    ratio: float = setting(0.5, "A ratio.")
    verbose: bool = setting(False, "Chatty.")
    name: str = setting("x", "Name.", choices=("x", "y"))
    limit: int | None = setting(None, "Optional limit.")
    buckets: tuple[int, ...] = setting((64, 128), "Buckets.")
    workers: int = setting(4, "Workers.", minimum=1)


P = "EMBEDFLEET_DEMO_"


def test_defaults() -> None:
    assert load(Demo, P, argv=[], env={}) == Demo()


def test_env_then_flag_precedence() -> None:
    env = {"EMBEDFLEET_DEMO_PORT": "9000", "EMBEDFLEET_DEMO_VERBOSE": "yes"}
    got = load(Demo, P, argv=["--port", "9100", "--buckets", "1,2,3"], env=env)
    assert got.port == 9100  # the flag wins over the env var
    assert got.verbose is True
    assert got.buckets == (1, 2, 3)


def test_optional_empty_is_none() -> None:
    assert load(Demo, P, argv=["--limit", ""], env={}).limit is None
    assert load(Demo, P, argv=["--limit", "7"], env={}).limit == 7


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EMBEDFLEET_DEMO_PORT": "eighty"}, "EMBEDFLEET_DEMO_PORT"),
        ({"EMBEDFLEET_DEMO_VERBOSE": "maybe"}, "EMBEDFLEET_DEMO_VERBOSE"),
        ({"EMBEDFLEET_DEMO_NAME": "z"}, "not one of"),
        ({"EMBEDFLEET_DEMO_WORKERS": "0"}, "EMBEDFLEET_DEMO_WORKERS: 0 is below the minimum, 1"),
    ],
)
def test_bad_values_name_their_source(env: dict[str, str], message: str) -> None:
    ns = argparse.Namespace()
    with pytest.raises(SettingsError, match=message):
        from_namespace(Demo, ns, P, env)


def test_bad_flag_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load(Demo, P, argv=["--port", "x"], env={})
    assert exc.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_markdown_table_lists_every_field() -> None:
    table = markdown_table(Demo, P)
    for flag, env in [("--port", "EMBEDFLEET_DEMO_PORT"), ("--buckets", "EMBEDFLEET_DEMO_BUCKETS")]:
        assert f"`{flag}`" in table
        assert f"`{env}`" in table
    assert "`64,128`" in table
    assert "One of: x, y." in table
    assert "Workers. At least 1." in table


def test_the_minimum_is_inclusive() -> None:
    assert load(Demo, P, argv=["--workers", "1"], env={}).workers == 1
