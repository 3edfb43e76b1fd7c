"""The Classify and SparseEmbed RPCs on a REAL worker process serving a random-weight SPLADE
checkpoint: replies, the task check and bad input as gRPC status codes."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from embedfleet.common.codec import pack_tokens, unpack_sparse, unpack_tokens
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.testing.workers import running_worker, worker_stub

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def splade_worker(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[pb_grpc.WorkerStub]:
    path = family_dirs.get("splade")
    args = ("--model", str(path), "--warmup-seconds", "0.2", "--threads", "1")
    with running_worker(tmp_path_factory.mktemp("splade-worker"), *args) as worker:
        yield worker_stub(worker.channel())


def batch(family_dirs: FamilyDirs) -> pb.TokenBatch:
    tok = load_model_dir(family_dirs.get("splade")).tokenizer()
    return pack_tokens([tok.encode(t).ids for t in families.TEXTS[:4]])


def test_sparse_embed_reply(splade_worker: pb_grpc.WorkerStub, family_dirs: FamilyDirs) -> None:
    info = splade_worker.Info(pb.InfoRequest())
    vocab = load_model_dir(family_dirs.get("splade")).vocab_size
    assert (info.task, info.dimensions) == ("sparse", vocab)
    reply = splade_worker.SparseEmbed(pb.SparseEmbedRequest(batch=batch(family_dirs), top_k=3))
    assert (reply.count, reply.dimensions) == (4, vocab)
    rows = unpack_sparse(reply.offsets, reply.indices, reply.values, reply.count)
    for ids, values in rows:
        assert ids.size == 3
        assert (np.diff(ids) > 0).all()
        assert (values > 0).all()
    assert reply.prompt_tokens == unpack_tokens(batch(family_dirs)).total


def test_wrong_rpc_and_bad_threshold(
    splade_worker: pb_grpc.WorkerStub, family_dirs: FamilyDirs
) -> None:
    tokens = batch(family_dirs)
    for call, request in [
        (splade_worker.Classify, pb.ClassifyRequest(batch=tokens)),
        (splade_worker.Embed, pb.EmbedRequest(batch=tokens)),
        (splade_worker.Score, pb.ScoreRequest(batch=tokens)),
    ]:
        with pytest.raises(grpc.RpcError) as failed:
            call(request)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "sparse model" in failed.value.details()
    for threshold in (-1.0, float("nan")):
        with pytest.raises(grpc.RpcError) as failed:
            splade_worker.SparseEmbed(pb.SparseEmbedRequest(batch=tokens, threshold=threshold))
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "threshold" in failed.value.details()
