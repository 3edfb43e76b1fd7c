"""The models one gateway serves, and which of them a request's `model` names (pure).

A gateway serves one model unless `--models-file` lists several (a shared gateway): each entry
overrides the per-model settings below for its own model, and the rest of `GatewaySettings` (the
HTTP server, auth, tracing, request limits) is the process's, shared by every model. Each model
has its own tokenizer, workers (found by its own discovery), balancer, admission and hold.

The file is JSON: `{"models": [{"served_model_name": "a", "model": "/models/a",
"k8s_service": "a-worker"}, ...]}`, keys spelled as the settings' field names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from embedfleet.gateway import errors
from embedfleet.gateway.settings import GatewaySettings

#: the settings an entry of the models file may set: what differs from model to model
PER_MODEL = (
    "model",
    "task",
    "served_model_name",
    "max_input_tokens",
    "quantization_file",
    "split_long_inputs",
    "split_overlap_tokens",
    "workers",
    "workers_file",
    "k8s_service",
    "k8s_port_name",
    "chunk_tokens",
    "min_chunk_tokens",
    "chunk_sequences",
    "max_queue_seconds",
    "hold_requests",
    "hold_seconds",
)


class CatalogError(ValueError):
    """The models file cannot be used; the message says which entry and field."""


def _typed(name: str, value: Any, default: Any, where: str) -> Any:
    """`value` as the type of the setting's default; bool is not an int here, nor int a bool."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, tuple):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        kind = {bool: "a boolean", int: "an integer", float: "a number", tuple: "a list of strings"}
        raise CatalogError(
            f"{where}: '{name}' must be {kind.get(type(default), 'a string')}, got {value!r}"
        )
    return value


def parse_models(text: str, base: GatewaySettings) -> list[GatewaySettings]:
    """Each entry of a models file as the settings of its model (`base` for everything else)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CatalogError(f"the models file is not JSON: {exc}") from None
    entries = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CatalogError('the models file needs a non-empty list "models"')
    defaults = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    out = []
    for i, entry in enumerate(entries):
        where = f"models[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{where} must be an object")
        unknown = sorted(set(entry) - set(PER_MODEL))
        if unknown:
            raise CatalogError(
                f"{where}: {', '.join(unknown)} cannot be set per model (per-model settings: "
                f"{', '.join(PER_MODEL)})"
            )
        values = {k: _typed(k, v, defaults[k], where) for k, v in entry.items()}
        if not (values.get("workers") or values.get("workers_file") or values.get("k8s_service")):
            raise CatalogError(f"{where}: name its workers (workers, workers_file or k8s_service)")
        # Each model's workers are its entry's alone: a --workers of the process joins none.
        found = {"workers": (), "workers_file": "", "k8s_service": "", **values}
        out.append(dataclasses.replace(base, **found))
    return out


@dataclass(frozen=True)
class Catalog:
    """The served names in order (the first is the gateway's default when there is one model)."""

    names: tuple[str, ...]

    @classmethod
    def of(cls, names: Sequence[str]) -> Catalog:
        seen: set[str] = set()
        for name in names:
            if not name:
                raise CatalogError("a model has an empty name; set served_model_name")
            if name in seen:
                raise CatalogError(
                    f"two models are served as '{name}'; give each its own served_model_name"
                )
            seen.add(name)
        return cls(tuple(names))

    def pick(self, requested: str | None) -> str:
        """The served name a request's `model` selects; else the error to answer.

        One model: a request without `model` gets it, as before shared gateways. Several: the
        request must name one, since any default would answer with a model it did not ask for.
        An unknown name is a 404 (OpenAI's model_not_found), whatever the count.
        """
        if requested is None:
            if len(self.names) == 1:
                return self.names[0]
            raise errors.invalid(
                f"'model' is required: this server serves {self.served()}.", param="model"
            )
        if requested in self.names:
            return requested
        if len(self.names) == 1:
            serves = f"this server serves '{self.names[0]}'"
        else:
            serves = f"this server serves {self.served()}"
        raise errors.not_found(
            f"The model '{requested}' does not exist; {serves}.",
            param="model",
            code="model_not_found",
        )

    def served(self) -> str:
        """The served names for an error message."""
        return ", ".join(f"'{n}'" for n in self.names)
