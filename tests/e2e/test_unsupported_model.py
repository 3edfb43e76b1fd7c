"""A fleet of a model the workers do not serve, on the real node: the worker refuses it in one
line, the operator writes that line into the EmbeddingDeployment's conditions (reason
UnsupportedModel) and holds the worker Deployment at zero instead of letting it crash-loop.
Runs on its own (its own helm install):

    flock /tmp/embedfleet-heavy.lock .venv/bin/pytest tests/e2e/test_unsupported_model.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from embedfleet.common.modeldir import default_model_path

from .e2efleet import EXAMPLE, FIGURES, NAMESPACE, Fleet, condition

CLAIM = "unsupported-model"
#: Alibaba GTE v1.5's config.json, abridged: a model_type with no engine family (its modeling code
#: ships with its weights), but the hidden size and vocabulary a gateway reads
GTE_V15 = {
    "model_type": "new",
    "architectures": ["NewModel"],
    "auto_map": {"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"},
    "hidden_size": 768,
    "vocab_size": 30528,
    "max_position_embeddings": 8192,
}


@pytest.fixture
def unsupported_claim(installed: Fleet) -> Iterator[str]:
    """A ReadOnlyMany claim bound to a hostPath volume holding that config.json and MiniLM's
    tokenizer: what a user's model cache claim would hold. Removed after the test."""
    folder = Path(tempfile.mkdtemp(prefix="embedfleet-e2e-model-"))
    folder.chmod(0o755)  # the pods run as uid 65532
    (folder / "config.json").write_text(json.dumps(GTE_V15))
    shutil.copy(default_model_path() / "tokenizer.json", folder / "tokenizer.json")
    for file in folder.iterdir():
        file.chmod(0o644)
    claim = {"namespace": NAMESPACE, "name": CLAIM}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": CLAIM},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": claim,
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": claim,
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": CLAIM,
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }
    listed = {"apiVersion": "v1", "kind": "List", "items": [volume, pvc]}
    try:
        installed.kubectl("apply", "-f", "-", input=json.dumps(listed))
        yield CLAIM
    finally:
        for kind in ("embeddingdeployment/minilm", f"pvc/{CLAIM}"):
            installed.kubectl("delete", kind, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
        installed.kubectl("delete", f"pv/{CLAIM}", "--ignore-not-found", "--wait=true")
        shutil.rmtree(folder, ignore_errors=True)


def test_an_unsupported_model_is_refused_in_the_status_without_a_crash_loop(
    installed: Fleet, unsupported_claim: str
) -> None:
    fleet = installed
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["model"]["source"] = f"pvc://{unsupported_claim}/."
    manifest["spec"]["worker"]["replicas"] = 1
    started = time.monotonic()
    fleet.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def refused() -> dict[str, object] | None:
        cond = condition(fleet.emb(), "Degraded")
        return cond if cond and cond["reason"] == "UnsupportedModel" else None

    try:
        cond = fleet.wait("Degraded=UnsupportedModel", refused, timeout=300)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{fleet.describe()}") from err
    FIGURES["apply to UnsupportedModel (s)"] = round(time.monotonic() - started, 1)
    message = str(cond["message"])
    assert message.startswith("unsupported model: model_type 'new' cannot be served"), message
    assert "embed: bert" in message
    assert "Ask for it at" in message
    available = condition(fleet.emb(), "Available")
    assert available is not None
    assert (available["status"], available["reason"]) == ("False", "UnsupportedModel")

    # No crash loop: the worker Deployment is held at zero and its pods go.
    assert fleet.deployment("worker")["spec"]["replicas"] == 0
    fleet.wait("the refused worker pods gone", lambda: not fleet.pods("worker") or None, 120)
    time.sleep(15)  # a crash loop, or a reconcile undoing the hold, would bring a pod back
    assert not fleet.pods("worker"), "worker pods came back after the refusal"
    assert condition(fleet.emb(), "Degraded") == cond  # nothing rewritten while it stands
    events = fleet.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                           "reason=UnsupportedModel", "-o", "name")  # fmt: skip
    assert events.strip(), "no UnsupportedModel Event"
