"""The HybridEmbed RPC on a REAL worker process serving a random-weight bge-m3 with --task hybrid:
the outputs its flags ask for (none: all three), each as the single RPC's reply encodes it; Embed
answered with the dense vector, the other single RPCs refused."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_tokens, unpack_floats, unpack_sparse
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.testing.workers import running_worker, worker_stub

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hybrid_worker(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[pb_grpc.WorkerStub]:
    path = family_dirs.get("bge-m3")
    # float32: compared at its tolerance (`auto` is bfloat16 on a CPU with native bf16)
    args = ("--model", str(path), "--task", "hybrid", "--warmup-seconds", "0.2", "--threads", "1")
    args += ("--dtype", "float32")
    with running_worker(tmp_path_factory.mktemp("hybrid-worker"), *args) as worker:
        yield worker_stub(worker.channel())


def seqs(family_dirs: FamilyDirs) -> list[list[int]]:
    tok = load_model_dir(family_dirs.get("bge-m3")).tokenizer()
    return [tok.encode(t).ids for t in families.TEXTS[:3]]


def test_no_flag_asks_for_all_three(
    hybrid_worker: pb_grpc.WorkerStub, family_dirs: FamilyDirs
) -> None:
    ids = seqs(family_dirs)
    reply = hybrid_worker.HybridEmbed(pb.HybridEmbedRequest(batch=pack_tokens(ids), top_k=4))
    assert reply.HasField("dense")
    assert reply.HasField("sparse")
    assert reply.HasField("multi_vector")
    assert reply.prompt_tokens == sum(map(len, ids))
    dense = unpack_floats(reply.dense.embeddings, reply.dense.count, reply.dense.dimensions)
    np.testing.assert_allclose(
        dense, families.bge_m3_dense(family_dirs.get("bge-m3"), ids), rtol=1e-4, atol=1e-5
    )
    sparse = reply.sparse
    rows = unpack_sparse(sparse.offsets, sparse.indices, sparse.values, sparse.count)
    assert [r[0].size for r in rows] == [4, 4, 4]
    vectors = reply.multi_vector
    offsets = np.frombuffer(vectors.offsets, "<i4")
    assert offsets.tolist() == np.cumsum([0, *(len(s) - 1 for s in ids)]).tolist()
    only = hybrid_worker.HybridEmbed(
        pb.HybridEmbedRequest(batch=pack_tokens(ids), multi_vector=True)
    )
    assert not only.HasField("dense")
    assert not only.HasField("sparse")
    assert only.multi_vector == vectors


def test_embed_gets_the_dense_vector_with_its_options(
    hybrid_worker: pb_grpc.WorkerStub, family_dirs: FamilyDirs
) -> None:
    batch = pack_tokens(seqs(family_dirs))
    hybrid = hybrid_worker.HybridEmbed(pb.HybridEmbedRequest(batch=batch, dense=True))
    full = hybrid_worker.Embed(pb.EmbedRequest(batch=batch))
    assert full == hybrid.dense
    cut = hybrid_worker.Embed(pb.EmbedRequest(batch=batch, dimensions=16, normalize=False))
    assert (cut.count, cut.dimensions) == (3, 16)
    rows = unpack_floats(full.embeddings, full.count, full.dimensions)
    raw = unpack_floats(cut.embeddings, cut.count, cut.dimensions)
    # Truncated before normalizing, and left unnormalized as asked.
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(_unit(raw), _unit(rows[:, :16]), atol=1e-5)


def _unit(rows: FloatArray) -> FloatArray:
    unit: FloatArray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit


def test_other_single_rpcs_and_a_bad_threshold_are_refused(
    hybrid_worker: pb_grpc.WorkerStub, family_dirs: FamilyDirs
) -> None:
    batch = pack_tokens(seqs(family_dirs))
    with pytest.raises(grpc.RpcError) as failed:
        hybrid_worker.SparseEmbed(pb.SparseEmbedRequest(batch=batch))
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "serves a hybrid model" in failed.value.details()
    with pytest.raises(grpc.RpcError) as failed:
        hybrid_worker.HybridEmbed(pb.HybridEmbedRequest(batch=batch, threshold=-1))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
