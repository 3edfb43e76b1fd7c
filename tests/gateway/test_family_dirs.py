"""The gateway reads every model family's directory the way the worker does: started on each
family's random-weight directory (testing.families), it describes the model on TEI's /info and
tokenizes as `transformers` does. The engine's parity tests start no gateway and feed token ids,
so a config key that one family names its own way (DistilBERT's `dim` for `hidden_size`) failed
only at `embedfleet serve`, and a tokenizer file that `transformers` reads another way than
tokenizers does (Gemma's, whose class rebuilds its own pipeline) was never compared."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from embedfleet.testing import families
from embedfleet.testing.gateway import running_gateway

#: a family's directory builder: a folder in, the model directory out
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "distilbert": families.distilbert,
    "mpnet": families.mpnet,
    "modernbert": families.modernbert,
    "bert-dense": families.bert_dense,
    "pylate-colbert": families.pylate_colbert,
    "bge-m3": families.bge_m3,
    "splade": families.splade,
    "bge-reranker": families.xlmr_reranker,
    "finbert": families.finbert,
    "go-emotions": families.go_emotions,
    "qwen3-reranker": families.qwen3_reranker,
    **{name: partial(families.decoder_embedder, published=name) for name in families.DECODERS},
}


#: the test tokenizers' own texts, and characters none of them was trained on
TEXTS = [*families.TEXTS[:3], "Zürich 42: naïve café, ÆØÅ — 東京!"]


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_gateway_serves_each_familys_directory(family: str, tmp_path: Path) -> None:
    model = BUILDERS[family](tmp_path / family)
    config = json.loads((model / "config.json").read_text())
    workers = tmp_path / "workers"
    workers.write_text("")  # none: the model's directory is all the gateway reads
    flags = ("--model", str(model), "--workers-file", str(workers))
    with running_gateway([], *flags, log=tmp_path / "log", wait_ready=False) as gw:
        info = _call(gw.url + "/info")
        tokens = _call(gw.url + "/tokenize", {"inputs": TEXTS})
    assert info["model_id"], info
    assert info["max_input_length"] > 0, info
    served = [[t["id"] for t in text] for text in tokens]
    assert all(config["vocab_size"] > max(ids) >= 0 for ids in served)
    reference = AutoTokenizer.from_pretrained(str(model))
    assert served == [reference(t)["input_ids"] for t in TEXTS]
