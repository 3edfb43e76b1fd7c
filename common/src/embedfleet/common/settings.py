"""Config objects whose every field is documented once and settable by flag and by env var.

A component declares one frozen dataclass; each field uses :func:`setting` to carry its help text.
:func:`load` builds the argument parser from the dataclass, so the flag ``--max-batch-tokens``, the
env var ``EMBEDFLEET_WORKER_MAX_BATCH_TOKENS`` and the docs table can never drift apart.
Precedence: command-line flag > environment variable > default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_HELP = "embedfleet.help"
_CHOICES = "embedfleet.choices"
_MINIMUM = "embedfleet.minimum"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A flag or environment variable holds a value its field cannot take."""


def setting(
    default: Any,
    help: str,
    *,
    choices: Sequence[str] | None = None,
    minimum: float | None = None,
) -> Any:
    """Declare a documented field; `default` may be a zero-argument factory for mutable values.

    `minimum` (inclusive) rejects a smaller number from a flag or env var with a readable error
    instead of a process that starts and misbehaves (no workers, a write on every tick)."""
    metadata = {_HELP: help, _CHOICES: tuple(choices) if choices else None, _MINIMUM: minimum}
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(prefix: str, field_name: str) -> str:
    return prefix + field_name.upper()


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """Strip `X | None`; returns (X, optional)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _parse(annotation: Any, raw: str, where: str) -> Any:
    base, optional = _base_type(annotation)
    if optional and raw.strip() == "":
        return None
    try:
        if base is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")
        if base is int:
            return int(raw)
        if base is float:
            return float(raw)
        if base is str:
            return raw
        origin = typing.get_origin(base)
        if origin is tuple:
            (item,) = {a for a in typing.get_args(base) if a is not Ellipsis}
            parts = [p.strip() for p in raw.split(",") if p.strip()]
            return tuple(_parse(item, p, where) for p in parts)
    except ValueError as exc:
        raise SettingsError(f"{where}: cannot parse {raw!r}: {exc}") from None
    raise TypeError(f"unsupported settings type {annotation!r}")


def _fields(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"setting {f.name} has no default")


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any], prefix: str) -> None:
    """Add one flag per field; values are parsed later so env and flags share one parser."""
    for f, _ in _fields(cls):
        help_text = f.metadata.get(_HELP, "")
        choices = f.metadata.get(_CHOICES)
        suffix = f" [env {env_name(prefix, f.name)}; default {_default(f)!r}]"
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            choices=choices,
            help=help_text + suffix,
        )


def from_namespace(
    cls: type[T], ns: argparse.Namespace, prefix: str, env: Mapping[str, str] | None = None
) -> T:
    environ = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f, annotation in _fields(cls):
        choices = f.metadata.get(_CHOICES)
        raw = getattr(ns, f.name, None)
        where = flag_name(f.name)
        if raw is None:
            raw = environ.get(env_name(prefix, f.name))
            where = env_name(prefix, f.name)
        if raw is None:
            continue
        value = _parse(annotation, raw, where)
        if choices and value not in choices:
            raise SettingsError(f"{where}: {value!r} is not one of {list(choices)}")
        minimum = f.metadata.get(_MINIMUM)
        # Written so NaN fails too: "nan" parses as a float and compares false with anything.
        if minimum is not None and value is not None and not value >= minimum:
            raise SettingsError(f"{where}: {value!r} is below the minimum, {minimum:g}")
        values[f.name] = value
    return cls(**values)


def load(
    cls: type[T],
    prefix: str,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    prog: str | None = None,
    description: str | None = None,
) -> T:
    """Parse `argv` (default sys.argv[1:]) and `env` (default os.environ) into a `cls` instance."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser, cls, prefix)
    ns = parser.parse_args(argv)
    try:
        return from_namespace(cls, ns, prefix, env)
    except SettingsError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def minimums(cls: type[Any]) -> dict[str, float]:
    """Each field of `cls` that declares a minimum, and the minimum."""
    return {
        f.name: float(f.metadata[_MINIMUM])
        for f, _ in _fields(cls)
        if f.metadata.get(_MINIMUM) is not None
    }


def markdown_table(cls: type[Any], prefix: str) -> str:
    """The docs table for a settings class: flag, env var, default, description."""
    rows = ["| flag | env var | default | description |", "| --- | --- | --- | --- |"]
    for f, _ in _fields(cls):
        default = _default(f)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = str(f.metadata.get(_HELP, "")).replace("|", "\\|")
        choices = f.metadata.get(_CHOICES)
        if choices:
            help_text += f" One of: {', '.join(choices)}."
        minimum = f.metadata.get(_MINIMUM)
        if minimum is not None:
            help_text += f" At least {minimum:g}."
        cell = "unset" if default is None else f"`{shown}`"
        rows.append(
            f"| `{flag_name(f.name)}` | `{env_name(prefix, f.name)}` | {cell} | {help_text} |"
        )
    return "\n".join(rows) + "\n"
