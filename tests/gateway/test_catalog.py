"""The models file of a shared gateway and the pick of a request's model (pure)."""

from __future__ import annotations

import orjson
import pytest

from embedfleet.gateway import errors
from embedfleet.gateway.catalog import Catalog, CatalogError, parse_models
from embedfleet.gateway.settings import GatewaySettings

BASE = GatewaySettings(
    max_client_batch=64, upstream_timeout_seconds=7.0, workers=("127.0.0.1:9",), k8s_service="x"
)


def _file(*entries: dict[str, object]) -> str:
    return orjson.dumps({"models": list(entries)}).decode()


def test_each_entry_overrides_only_its_own_models_settings() -> None:
    a, b = parse_models(
        _file(
            {"served_model_name": "a", "model": "/m/a", "k8s_service": "a-worker"},
            {
                "served_model_name": "b",
                "workers": ["127.0.0.1:1", "127.0.0.1:2"],
                "split_long_inputs": True,
                "max_input_tokens": 128,
                "max_queue_seconds": 3,
            },
        ),
        BASE,
    )
    assert (a.served_model_name, a.model, a.k8s_service, a.workers) == ("a", "/m/a", "a-worker", ())
    # The process's own --workers and --k8s-service belong to no model.
    assert b.k8s_service == ""
    assert (b.workers, b.split_long_inputs, b.max_input_tokens) == (
        ("127.0.0.1:1", "127.0.0.1:2"),
        True,
        128,
    )
    assert b.max_queue_seconds == 3.0
    assert isinstance(b.max_queue_seconds, float)
    # The process's own settings are the base's, for every model.
    assert {s.max_client_batch for s in (a, b)} == {64}
    assert {s.upstream_timeout_seconds for s in (a, b)} == {7.0}
    assert not a.split_long_inputs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", 'non-empty list "models"'),
        ('{"models": []}', 'non-empty list "models"'),
        ('{"models": [3]}', "models[0] must be an object"),
        (_file({"k8s_service": "w", "port": 9}), "port cannot be set per model"),
        (_file({"k8s_service": "w", "api_keys_file": "/k"}), "api_keys_file cannot be set"),
        (_file({"k8s_service": "w", "max_input_tokens": "9"}), "'max_input_tokens' must be an"),
        (_file({"k8s_service": "w", "split_long_inputs": 1}), "'split_long_inputs' must be a b"),
        (_file({"k8s_service": "w", "hold_requests": True}), "'hold_requests' must be an integer"),
        (_file({"workers": "127.0.0.1:1"}), "'workers' must be a list of strings"),
        (_file({"k8s_service": "w"}, {"model": "/m"}), "models[1]: name its workers"),
    ],
)
def test_a_bad_models_file_is_refused_naming_the_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_models(text, BASE)
    assert message in str(caught.value)


def test_names_must_be_unique_and_non_empty() -> None:
    with pytest.raises(CatalogError, match="two models are served as 'a'"):
        Catalog.of(["a", "b", "a"])
    with pytest.raises(CatalogError, match="empty name"):
        Catalog.of(["a", ""])


def _refusal(catalog: Catalog, requested: str | None) -> errors.ApiError:
    with pytest.raises(errors.ApiError) as caught:
        catalog.pick(requested)
    return caught.value


def test_one_model_answers_requests_without_a_model_and_404s_other_names() -> None:
    one = Catalog.of(["minilm"])
    assert one.pick(None) == "minilm"
    assert one.pick("minilm") == "minilm"
    err = _refusal(one, "gpt-4")
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")
    assert err.message == "The model 'gpt-4' does not exist; this server serves 'minilm'."


def test_several_models_route_by_name_and_need_one() -> None:
    several = Catalog.of(["a", "b"])
    assert several.pick("a") == "a"
    assert several.pick("b") == "b"
    missing = _refusal(several, None)
    assert (missing.status, missing.param) == (400, "model")
    assert "'a', 'b'" in missing.message
    unknown = _refusal(several, "c")
    assert (unknown.status, unknown.code) == (404, "model_not_found")
    assert "'c' does not exist" in unknown.message
    assert "'a', 'b'" in unknown.message
    # Names are exact: no case folding, no prefix matches.
    assert _refusal(several, "A").status == 404
