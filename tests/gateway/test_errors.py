"""Refusals as clients see them: each bad request's status and OpenAI-shaped error (type, param,
code, the words of its message), before any worker is called; routes, methods, media types, body
limits and JSON faults; the HTTP contract the document promises."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import Gateway

LONG = "the quick brown fox jumps over the lazy dog " * 40  # 362 tokens: over 256
HUGE = "lorem ipsum dolor sit amet " * 4000  # past the first window
INPUT_FORMS = (
    "'input' must be a non-empty string, an array of strings, an array of token ids (integers) "
    "or an array of arrays of token ids."
)
OVER = 'more than this model\'s limit of 256. Shorten it, pass "truncate": true to cut it'
DOCUMENT_FORMS = "'documents' must be an array of strings or of {\"text\": string} objects."

#: name -> (path, body, status, param, code, a part of the message)
CASES: dict[str, tuple[str, Any, int, str | None, str | None, str]] = {
    "unknown model": ("/v1/embeddings", {"input": "x", "model": "other"}, 404, "model",
                      "model_not_found", "The model 'other' does not exist; this server serves "
                      "'sentence-transformers/all-MiniLM-L6-v2'."),
    "missing input": ("/v1/embeddings", {}, 400, "input", None, "'input' is required."),
    "empty input list": ("/v1/embeddings", {"input": []}, 400, "input", None,
                         "'input' must not be empty."),
    "empty string": ("/v1/embeddings", {"input": ""}, 400, "input", None,
                     "'input' item 0 is an empty string."),
    "empty string in list": ("/v1/embeddings", {"input": ["a", ""]}, 400, "input", None,
                             "'input' item 1 is an empty string."),
    "empty token id list": ("/v1/embeddings", {"input": [[1, 2], []]}, 400, "input", None,
                            "Input 1 is an empty list of token ids."),
    "token id past the vocabulary": ("/v1/embeddings", {"input": [30522]}, 400, "input", None,
                                     "Input 0 holds a token id outside this model's vocabulary "
                                     "[0, 30522)."),
    "negative token id": ("/v1/embeddings", {"input": [[5, -1]]}, 400, "input", None,
                          "outside this model's vocabulary"),
    "huge token id": ("/v1/embeddings", b'{"input": [1180591620717411303424]}', 400, "input",
                      None, INPUT_FORMS),
    "token id past int64 in a list": ("/v1/embeddings",
                                      b'{"input": [[1, 1180591620717411303424]]}', 400, "input",
                                      None, INPUT_FORMS),
    "float token id": ("/v1/embeddings", {"input": [1.0]}, 400, "input", None, INPUT_FORMS),
    "bool token id": ("/v1/embeddings", {"input": [True]}, 400, "input", None, INPUT_FORMS),
    "mixed list": ("/v1/embeddings", {"input": ["a", 1]}, 400, "input", None, INPUT_FORMS),
    "input a number": ("/v1/embeddings", {"input": 5}, 400, "input", None, INPUT_FORMS),
    "input an object": ("/v1/embeddings", {"input": {"text": "a"}}, 400, "input", None,
                        INPUT_FORMS),
    "texts and ids mixed": ("/v1/embeddings", {"input": [[1, 2], "a"]}, 400, "input", None,
                            INPUT_FORMS),
    "over-long text": ("/v1/embeddings", {"input": LONG}, 400, "input",
                       "context_length_exceeded", f"Input 0 has 362 tokens, {OVER}"),
    "over-long text second": ("/v1/embeddings", {"input": ["fine", LONG]}, 400, "input",
                              "context_length_exceeded", "Input 1 has 362 tokens"),
    "huge text": ("/v1/embeddings", {"input": HUGE}, 400, "input", "context_length_exceeded",
                  "Input 0 has at least "),
    "over-long token ids": ("/v1/embeddings", {"input": list(range(1, 400))}, 400, "input",
                            "context_length_exceeded", "Input 0 has 399 tokens"),
    "too many inputs": ("/v1/embeddings", {"input": ["x"] * 65}, 413, "input",
                        "request_too_large", "'input' holds 65 items; at most 64 are allowed "
                        "per request. Split the request."),
    "too many tokens": ("/v1/embeddings", {"input": [LONG] * 60, "truncate": True}, 413,
                        "input", "request_too_large", "The request holds 15360 tokens; at most "
                        "10000 are allowed per request."),
    "model not a string": ("/v1/embeddings", {"input": "x", "model": 3}, 400, "model", None,
                           "'model': Input should be a valid string."),
    "truncate not a bool": ("/v1/embeddings", {"input": "x", "truncate": "yes"}, 400,
                            "truncate", None, "'truncate': Input should be a valid boolean."),
    "truncate a number": ("/v1/embeddings", {"input": "x", "truncate": 1}, 400, "truncate",
                          None, "valid boolean"),
    "truncate null": ("/v1/embeddings", {"input": "x", "truncate": None}, 400, "truncate", None,
                      "valid boolean"),
    "truncation side": ("/v1/embeddings", {"input": "x", "truncation_side": "middle"}, 400,
                        "truncation_side", None, "Input should be 'left' or 'right'."),
    "encoding format": ("/v1/embeddings", {"input": "x", "encoding_format": "float16"}, 400,
                        "encoding_format", None, "'float', 'base64', 'int8', 'uint8', 'binary', "
                        "'ubinary', 'int8_base64', 'uint8_base64', 'binary_base64' or "
                        "'ubinary_base64'."),
    "int8 without ranges at these dimensions": (
        "/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format", None,
        "'int8' needs this model's int8 calibration at 4 dimensions, and the server has ranges "
        "for [384]."),
    "uint8 base64 without ranges": ("/v1/embeddings",
                                    {"input": "x", "encoding_format": "uint8_base64"}, 400,
                                    "encoding_format", None, "uint8 calibration at 4 dimensions"),
    "dimensions zero": ("/v1/embeddings", {"input": "x", "dimensions": 0}, 400, "dimensions",
                        None, "'dimensions': Input should be greater than or equal to 1."),
    "dimensions a string": ("/v1/embeddings", {"input": "x", "dimensions": "2"}, 400,
                            "dimensions", None, "valid integer"),
    "dimensions a float": ("/v1/embeddings", {"input": "x", "dimensions": 2.0}, 400,
                           "dimensions", None, "valid integer"),
    "dimensions above the model's": ("/v1/embeddings", {"input": "x", "dimensions": 5}, 400,
                                     "dimensions", None,
                                     "'dimensions' must be between 1 and 4 for this model; got 5."),
    "split and truncate": ("/v1/embeddings",
                           {"input": "x", "truncate": True, "split_long_inputs": True}, 400,
                           "split_long_inputs", None, "pick one way"),
    "split not a bool": ("/v1/embeddings", {"input": "x", "split_long_inputs": 1}, 400,
                         "split_long_inputs", None, "valid boolean"),
    "split past the request's tokens": ("/v1/embeddings",
                                        {"input": [HUGE], "split_long_inputs": True}, 413,
                                        "input", "request_too_large", "The request holds "),
    "user not a string": ("/v1/embeddings", {"input": "x", "user": 1}, 400, "user", None,
                          "valid string"),
    "input_type": ("/v1/embeddings", {"input": "x", "input_type": "passage"}, 400, "input_type",
                   None, "Input should be 'query' or 'document'."),
    "first failing field wins": ("/v1/embeddings", {"input": 1, "model": 2, "dimensions": 0},
                                 400, "model", None, "'model'"),
    "not an object": ("/v1/embeddings", ["input"], 400, None, None,
                      "The request body must be a JSON object."),
    "a string document": ("/v1/embeddings", "input", 400, None, None, "must be a JSON object"),
    "rerank without query": ("/v1/rerank", {"documents": ["d"]}, 400, "query", None,
                             "'query' is required."),
    "rerank query not a string": ("/v1/rerank", {"query": 1, "documents": ["d"]}, 400, "query",
                                  None, "'query' must be a string."),
    "rerank empty query": ("/v1/rerank", {"query": "", "documents": ["d"]}, 400, "query", None,
                           "'query' must not be empty."),
    "rerank without documents": ("/v1/rerank", {"query": "q"}, 400, "documents", None,
                                 "'documents' is required."),
    "rerank a document a number": ("/v1/rerank", {"query": "q", "documents": ["d", 3]}, 400,
                                   "documents", None, DOCUMENT_FORMS),
    "rerank documents not a list": ("/v1/rerank", {"query": "q", "documents": "d"}, 400,
                                    "documents", None, DOCUMENT_FORMS),
    "rerank a document without text": ("/v1/rerank", {"query": "q", "documents": [{"t": "d"}]},
                                       400, "documents", None, DOCUMENT_FORMS),
    "rerank an empty document": ("/v1/rerank", {"query": "q", "documents": ["d", ""]}, 400,
                                 "documents", None, "'documents' item 1 is an empty string."),
    "rerank no documents": ("/v1/rerank", {"query": "q", "documents": []}, 400, "documents",
                            None, "'documents' must not be empty."),
    "rerank too many documents": ("/v1/rerank", {"query": "q", "documents": ["d"] * 65}, 413,
                                  "documents", "request_too_large", "'documents' holds 65 items"),
    "rerank top_n zero": ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, 400,
                          "top_n", None, "greater than or equal to 1"),
    "rerank top_n a float": ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 1.0},
                             400, "top_n", None, "valid integer"),
    "rerank return_documents not a bool": ("/v1/rerank", {"query": "q", "documents": ["d"],
                                           "return_documents": 1}, 400, "return_documents",
                                           None, "valid boolean"),
    "rerank an instruction": ("/v1/rerank", {"query": "q", "documents": ["d"],
                              "instruction": "i"}, 400, "instruction", None,
                              "'instruction' applies only to prompt-template rerankers "
                              "(Qwen3-Reranker)"),
    "rerank a long document": ("/v1/rerank", {"query": "q", "documents": ["d", LONG]}, 400,
                               "input", "context_length_exceeded", "Input 1 has 362 tokens"),
    "rerank too many tokens": ("/v1/rerank", {"query": "q", "documents": [
                               LONG + str(i) for i in range(60)], "truncate": True}, 413,
                               "documents", "request_too_large", "The request holds 15363 tokens"),
    "rerank unknown model": ("/v1/rerank", {"query": "q", "documents": ["d"], "model": "m"},
                             404, "model", "model_not_found", "The model 'm' does not exist"),
    "score lists of different lengths": ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]},
                                         400, "text_2", None, "text_1 and text_2 are lists of "
                                         "different lengths (2 and 1)"),
    "score without text_2": ("/v1/score", {"text_1": "a"}, 400, "text_2", None,
                             "'text_2' is required."),
    "score text_1 a number": ("/v1/score", {"text_1": 1, "text_2": "b"}, 400, "text_1", None,
                              "'text_1' must be a string or an array of strings."),
    "score truncate not a bool": ("/v1/score", {"text_1": "a", "text_2": "b",
                                  "truncate": "true"}, 400, "truncate", None, "valid boolean"),
    "score an empty text": ("/v1/score", {"text_1": "a", "text_2": ["b", ""]}, 400, "text_1",
                            None, "Texts to score must not be empty."),
    "score no pairs": ("/v1/score", {"text_1": "a", "text_2": []}, 400, "text_2", None,
                       "'text_2' must not be empty."),
    "classify on an embedding model": ("/v1/classify", {"input": ["a", "b"]}, 400, "model",
                                       None, "'sentence-transformers/all-MiniLM-L6-v2' is an "
                                       "embedding model; /v1/classify needs a sequence "
                                       "classifier."),
    "classify a bad input on an embedding model": ("/v1/classify", {"input": [1]}, 400, "input",
                                                   None, INPUT_FORMS),
    "sparse on an embedding model": ("/v1/sparse_embeddings", {"input": ["a", "b"]}, 400,
                                     "model", None, "/v1/sparse_embeddings needs a sparse "
                                     "(SPLADE or bge-m3 lexical weights) embedding model. Use "
                                     "/v1/embeddings (and "
                                     "/v1/rerank, /v1/score by cosine)."),
    "sparse a bad threshold on an embedding model": ("/v1/sparse_embeddings",
                                                     {"input": "a", "threshold": -1}, 400,
                                                     "threshold", None,
                                                     "greater than or equal to 0"),
    "multi-vector on an embedding model": ("/v1/multi-vector", {"input": ["a"]}, 400, "model",
                                           None, "/v1/multi-vector needs a multi-vector "
                                           "(ColBERT) model. Use /v1/embeddings"),
    "multi-vector a bad encoding": ("/v1/multi-vector", {"input": "a", "encoding_format": "int8"},
                                    400, "encoding_format", None, "'float' or 'base64'"),
    "hybrid on an embedding model": ("/v1/hybrid-embeddings", {"input": ["a"]}, 400, "model",
                                     None, "/v1/hybrid-embeddings needs a hybrid (bge-m3 dense, "
                                     "sparse and multi-vector) model. Use /v1/embeddings"),
    "hybrid unknown outputs": ("/v1/hybrid-embeddings", {"input": "a", "outputs": ["colbert"]},
                               400, "outputs", None, "'dense', 'sparse' or 'multi_vector'"),
    "hybrid no outputs": ("/v1/hybrid-embeddings", {"input": "a", "outputs": []}, 400,
                          "outputs", None, "a non-empty list"),
    "hybrid a bad threshold": ("/v1/hybrid-embeddings", {"input": "a", "threshold": "x"}, 400,
                               "threshold", None, "valid number"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_each_refusal_is_its_status_and_error(fakes: Gateway, name: str) -> None:
    path, body, status, param, code, words = CASES[name]
    error = fakes.error(path, body, status)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert words in error["message"], error["message"]
    assert fakes.calls() == []  # refused before any worker was called


#: (method, path) -> (status, Allow, code)
ROUTES: dict[tuple[str, str], tuple[int, str | None, str | None]] = {
    ("GET", "/v1/embeddings"): (405, "POST", "method_not_allowed"),
    ("PUT", "/v1/embeddings"): (405, "POST", "method_not_allowed"),
    ("POST", "/health"): (405, "GET, HEAD", "method_not_allowed"),
    ("DELETE", "/v1/models"): (405, "GET, HEAD", "method_not_allowed"),
    ("POST", "/v1/models"): (405, "GET, HEAD", "method_not_allowed"),
    ("GET", "/nope"): (404, None, "not_found"),
    ("POST", "/v1/embeddings/"): (404, None, "not_found"),
}


@pytest.mark.parametrize(("method", "path"), list(ROUTES))
def test_wrong_routes_and_methods(fakes: Gateway, method: str, path: str) -> None:
    status, allow, code = ROUTES[method, path]
    reply = fakes.request(method, path, content=b"{}")
    assert reply.status == status
    assert reply.headers.get("allow") == allow
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    if status == 405:
        assert error["message"] == f"Use {allow.split(',')[0]} for {path}."  # type: ignore[union-attr]
    else:
        assert error["message"] == f"No route {path}."


def test_probes_and_the_model_list(fakes: Gateway) -> None:
    assert fakes.request("GET", "/health").json() == {"status": "ok"}
    head = fakes.request("HEAD", "/health")
    assert (head.status, head.body) == (200, b"")
    assert fakes.request("GET", "/ready").json() == {"ready": True}
    models = fakes.request("GET", "/v1/models").json()
    (entry,) = models["data"]
    assert isinstance(entry.pop("created"), int)
    assert models == {
        "object": "list",
        "data": [
            {
                "id": "sentence-transformers/all-MiniLM-L6-v2",
                "object": "model",
                "owned_by": "embedfleet",
            }
        ],
    }


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/json", 415),
        (None, 200),
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("application/x+json", 200),
    ],
)
def test_a_body_that_is_not_json_is_refused(
    fakes: Gateway, content_type: str | None, status: int
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    reply = fakes.post("/v1/embeddings", b'{"input": "x"}', headers=headers)
    assert reply.status == status, reply.body
    if status == 415:
        error = reply.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert error["message"] == "The request body must be JSON (Content-Type: application/json)."
    fakes.calls()


@pytest.mark.parametrize("body", [b"{bad", b"", b'{"input": "x",}', b"\xff"])
def test_a_body_that_is_not_valid_json_says_so(fakes: Gateway, body: bytes) -> None:
    error = fakes.error("/v1/embeddings", body, 400)
    assert (error["param"], error["code"]) == (None, None)
    assert error["message"].startswith("The request body is not valid JSON: ")


def test_a_body_over_the_limit_is_413(fakes: Gateway) -> None:
    error = fakes.error("/v1/embeddings", b"x" * 400_001, 413)
    assert error["code"] == "request_too_large"
    assert error["message"] == "The request body is over the limit of 400000 bytes."


def test_a_flat_token_list_over_the_batch_cap_is_one_input(fakes: Gateway) -> None:
    ids = [7] * 3000  # more ids than max_client_batch (64), and than MiniLM's 256 tokens
    cut = fakes.ok("/v1/embeddings", {"input": ids, "truncate": True})
    assert len(cut["data"]) == 1
    assert cut["usage"]["prompt_tokens"] == 256
    assert fakes.error("/v1/embeddings", {"input": ids}, 400)["code"] == "context_length_exceeded"
    # A list of lists still counts its items.
    assert fakes.error("/v1/embeddings", {"input": [[7]] * 65}, 413)["param"] == "input"
    fakes.calls()


def test_the_document_states_the_rules_and_every_status(fakes: Gateway) -> None:
    doc = fakes.request("GET", "/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    schemas = doc["components"]["schemas"]
    assert "securitySchemes" not in doc["components"]
    text, texts, ids, lists = schemas["EmbeddingRequest"]["properties"]["input"]["anyOf"]
    assert text == {"type": "string", "minLength": 1}
    assert (texts["minItems"], texts["items"]["minLength"]) == (1, 1)
    assert (ids["minItems"], ids["items"]) == (1, {"type": "integer", "minimum": 0})
    assert (lists["minItems"], lists["items"]["minItems"]) == (1, 1)
    rerank = schemas["RerankRequest"]["properties"]
    assert (rerank["query"]["minLength"], rerank["documents"]["minItems"]) == (1, 1)
    assert schemas["Document"]["properties"]["text"]["minLength"] == 1
    for side in ("text_1", "text_2"):
        one, many = schemas["ScoreRequest"]["properties"][side]["anyOf"]
        assert (one["minLength"], many["minItems"]) == (1, 1)
    assert schemas["EmbeddingRequest"]["properties"]["truncate"]["type"] == "boolean"
    every = {"200", "400", "404", "405", "408", "413", "415", "429", "502", "503", "504"}
    for path in ("/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/classify",
                 "/v1/sparse_embeddings", "/v1/multi-vector",
                 "/v1/hybrid-embeddings"):  # fmt: skip
        responses = doc["paths"][path]["post"]["responses"]
        assert every <= set(responses), path
        assert "Allow" in responses["405"]["headers"]
        assert "Retry-After" in responses["429"]["headers"]
    assert "405" in doc["paths"]["/v1/models"]["get"]["responses"]
