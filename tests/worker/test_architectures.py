"""What the worker serves, and its refusal of the rest: one line on stderr, in the termination
message file, exit code 78, before any weights are read or torch imported."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedfleet.common.exits import EXIT_REFUSED
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.worker.architectures import (
    ISSUES_URL,
    REFUSED,
    SERVED,
    check,
    main,
    refusal,
)

#: config.json of models users bring that the engine does not serve (abridged from their hubs)
NOMIC = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "n_embd": 768,
         "vocab_size": 30528, "auto_map": {"AutoModel": "nomic-ai/nomic-bert-2048--"
                                           "modeling_hf_nomic_bert.NomicBertModel"}}  # fmt: skip
JINA_V2 = {"model_type": "bert", "architectures": ["JinaBertForMaskedLM"], "hidden_size": 768,
           "vocab_size": 30528, "position_embedding_type": "alibi",
           "auto_map": {"AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
                        "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--"
                                                "modeling_bert.JinaBertForMaskedLM"}}  # fmt: skip
GTE_V15 = {"model_type": "new", "architectures": ["NewModel"], "hidden_size": 768,
           "vocab_size": 30528}  # fmt: skip
T5 = {"model_type": "t5", "architectures": ["T5EncoderModel"], "d_model": 768, "vocab_size": 10}


def model_dir(root: Path, config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (NOMIC, "NomicBertModel ships its modeling code"),
        (JINA_V2, "JinaBertForMaskedLM ships its modeling code"),
        (GTE_V15, "Alibaba GTE"),
        (T5, "no engine family implements it"),
    ],
)
def test_refusals_name_the_type_what_is_served_and_where_to_ask(
    tmp_path: Path, config: dict[str, object], why: str
) -> None:
    line = refusal(load_model_dir(model_dir(tmp_path, config)))
    assert line is not None
    assert "\n" not in line
    assert f"model_type {config['model_type']!r}" in line
    assert why in line
    assert "embed: bert, camembert, distilbert, gemma3_text, mistral, modernbert, mpnet" in line
    assert line.endswith(ISSUES_URL)


def test_a_served_type_for_another_task_is_refused(tmp_path: Path) -> None:
    config = {"model_type": "modernbert", "architectures": ["ModernBertForSequenceClassification"],
              "hidden_size": 8, "vocab_size": 10, "num_labels": 1}  # fmt: skip
    line = check(str(model_dir(tmp_path, config)), "auto")
    assert line is not None
    assert "served for embed, multivector only, not score" in line
    assert check(str(model_dir(tmp_path / "e", {**config, "architectures": []})), "embed") is None


def test_every_served_type_has_an_encoder_or_a_head() -> None:
    from embedfleet.worker.engine.models.family import DECODER_TYPES, ENCODERS

    for kind, heads in SERVED.items():
        assert "pool" in heads
        assert kind in ENCODERS or kind in DECODER_TYPES
    assert not set(SERVED) & set(REFUSED)


def run_worker(tmp_path: Path, model: Path, termination: Path) -> tuple[int, str, float]:
    argv = [sys.executable, "-m", "embedfleet.worker.cli", "--model", str(model), "--port", "0"]
    argv += ["--termination-message-path", str(termination), "--metrics-port", "0"]
    start = time.monotonic()
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    return done.returncode, done.stderr, time.monotonic() - start


def test_the_worker_refuses_in_one_line_before_loading_anything(tmp_path: Path) -> None:
    termination = tmp_path / "termination-log"
    termination.write_text("")  # the kubelet makes the file before the container starts
    code, stderr, seconds = run_worker(tmp_path, model_dir(tmp_path / "nomic", NOMIC), termination)
    assert code == EXIT_REFUSED
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("unsupported model: model_type 'nomic_bert'")
    assert "Traceback" not in stderr
    assert termination.read_text() == line
    assert seconds < 5, f"refused after {seconds:.1f} s"
    # No file where none was made: a local run must not write one.
    code, _, _ = run_worker(tmp_path, model_dir(tmp_path / "t5", T5), tmp_path / "absent")
    assert code == EXIT_REFUSED
    assert not (tmp_path / "absent").exists()


def test_a_directory_that_is_no_model_is_refused_the_same_way(tmp_path: Path) -> None:
    code, stderr, _ = run_worker(tmp_path, tmp_path, tmp_path / "absent")
    assert code == EXIT_REFUSED
    assert "no config.json" in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    # A wrong path says what to do instead.
    code, stderr, _ = run_worker(tmp_path, tmp_path / "nothing", tmp_path / "absent")
    assert code == EXIT_REFUSED
    assert stderr.strip().splitlines()[-1] == (
        f"no model directory at {tmp_path / 'nothing'}: give --model a directory holding "
        "config.json and the weights"
    )


def test_the_pre_check_command_says_the_line_or_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`embedfleet serve` runs this entry point before starting any child."""
    with pytest.raises(SystemExit) as usage:
        main([])
    assert str(usage.value.code).startswith("usage: python -m embedfleet.worker.architectures")
    with pytest.raises(SystemExit) as refused:
        main([str(model_dir(tmp_path / "nomic", NOMIC))])
    assert refused.value.code == EXIT_REFUSED
    assert capsys.readouterr().err.startswith("unsupported model: model_type 'nomic_bert'")
    main([str(default_model_path()), "embed"])  # served: returns, says nothing
    assert capsys.readouterr().err == ""
