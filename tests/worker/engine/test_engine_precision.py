"""Device and dtype choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedfleet.worker.engine import precision
from embedfleet.worker.engine.torch_engine import TorchEngine


def test_native_bf16_from_cpu_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n")
    assert precision.cpu_has_native_bf16(precision.cpu_flags(info))
    info.write_text("processor: 0\nflags\t\t: fpu sse avx2\n")
    assert not precision.cpu_has_native_bf16(precision.cpu_flags(info))
    assert precision.cpu_flags(tmp_path / "missing") == frozenset()


def test_candidate_dtype() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision.candidate_dtype("float32", cpu) == (torch.float32, False)
    assert precision.candidate_dtype("bfloat16", cpu) == (torch.bfloat16, False)
    assert precision.candidate_dtype("auto", cuda) == (torch.bfloat16, False)
    dtype, probe = precision.candidate_dtype("auto", cpu)
    assert probe == (dtype == torch.bfloat16)
    with pytest.raises(ValueError, match="unknown dtype"):
        precision.candidate_dtype("int8", cpu)


def test_probe_and_reference_outputs(minilm_fp32: TorchEngine) -> None:
    from embedfleet.worker.engine.probe import agreement, probe_items
    from embedfleet.worker.selfcheck import reference_outputs

    items = probe_items(minilm_fp32.model_dir, 512)
    lengths = [it.tokens.total for it in items]
    assert min(lengths) > 1
    assert max(lengths) == 512
    # A decoder's 32k window is not probed in full: 512 tokens say what the dtype does.
    assert max(it.tokens.total for it in probe_items(minilm_fp32.model_dir, 32768)) == 512
    ref = reference_outputs("", items, max_input_tokens=512)
    got = minilm_fp32.run(items)
    assert agreement(got, ref, "embed")[0] >= 0.99999
    # A wrong answer is seen: a shuffled row order disagrees.
    assert agreement(got[::-1], ref, "embed")[0] < 0.99
    scores = [np.array([0.5, -1.0], np.float32)]
    assert agreement(scores, [np.array([0.5, -1.002], np.float32)], "score")[1] > 1e-3
