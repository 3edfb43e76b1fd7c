"""Kubeconfig files with embedded credentials (portable: they do not point into the run dir)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from embedfleet.testing.pki import KeyPair

CONTEXT = "embedfleet"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def kubeconfig_document(server: str, ca_cert: Path, client: KeyPair, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: KeyPair, user: str) -> Path:
    """Writes the kubeconfig as JSON (valid YAML, so every client reads it) with mode 0600."""
    path.write_text(json.dumps(kubeconfig_document(server, ca_cert, client, user), indent=2) + "\n")
    path.chmod(0o600)
    return path
