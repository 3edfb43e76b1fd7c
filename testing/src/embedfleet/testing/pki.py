"""Certificates and keys for a throwaway cluster, made with the openssl CLI.

The openssl CLI rather than a Python crypto package keeps the cluster harness standard-library
only, so hack/dev-cluster runs before any virtualenv exists. P-256 keys: fast to generate.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 3650


class PkiError(RuntimeError):
    """openssl failed."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate's subject: CN is the user name, O the groups (RBAC subjects)."""

    user: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterPki:
    ca: KeyPair
    apiserver: KeyPair
    service_account_key: Path
    """Signs service-account tokens."""
    service_account_pub: Path
    """Verifies them."""
    clients: Mapping[str, KeyPair]


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _request_config(subject: Sequence[tuple[str, str]], extensions: Sequence[str]) -> str:
    """An openssl req config holding the subject and the X.509 extensions of one certificate."""
    lines = ["[req]", "prompt = no", "distinguished_name = dn", "x509_extensions = ext", "[dn]"]
    lines += [f"{field} = {value}" for field, value in subject]
    lines += ["[ext]", *extensions]
    return "\n".join(lines) + "\n"


def _issue(
    directory: Path,
    name: str,
    subject: Sequence[tuple[str, str]],
    extensions: Sequence[str],
    issuer: KeyPair | None,
) -> KeyPair:
    pair = KeyPair(cert=directory / f"{name}.crt", key=directory / f"{name}.key")
    config = directory / f"{name}.cnf"
    config.write_text(_request_config(subject, extensions))
    args = ["req", "-x509", "-new", "-config", str(config), "-days", str(VALID_DAYS)]
    args += ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    args += ["-keyout", str(pair.key), "-out", str(pair.cert)]
    if issuer is not None:
        args += ["-CA", str(issuer.cert), "-CAkey", str(issuer.key)]
    _openssl(*args)
    config.unlink()
    pair.key.chmod(0o600)
    return pair


_LEAF = ("basicConstraints = critical, CA:FALSE", "keyUsage = critical, digitalSignature")


def issue_client(directory: Path, name: str, identity: ClientIdentity, ca: KeyPair) -> KeyPair:
    """A client certificate for `identity`, signed by `ca`, as <directory>/<name>.crt/.key."""
    subject = [("O", group) for group in identity.groups] + [("CN", identity.user)]
    # Several O fields in one [dn] section need distinct keys: openssl accepts "N.O".
    subject = [(f"{i}.{field}", value) for i, (field, value) in enumerate(subject)]
    return _issue(directory, name, subject, [*_LEAF, "extendedKeyUsage = clientAuth"], issuer=ca)


def create_pki(
    directory: Path,
    *,
    server_names: Sequence[str],
    server_ips: Sequence[str],
    clients: Mapping[str, ClientIdentity],
) -> ClusterPki:
    """Writes a CA, the API server's serving pair, one client pair per entry and a SA key."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _issue(
        directory,
        "ca",
        [("CN", "embedfleet-test-ca")],
        [
            "basicConstraints = critical, CA:TRUE",
            "keyUsage = critical, keyCertSign, cRLSign, digitalSignature",
            "subjectKeyIdentifier = hash",
        ],
        issuer=None,
    )
    alt_names = [f"DNS:{n}" for n in server_names] + [f"IP:{ip}" for ip in server_ips]
    apiserver = _issue(
        directory,
        "apiserver",
        [("CN", "kube-apiserver")],
        [*_LEAF, "extendedKeyUsage = serverAuth", f"subjectAltName = {', '.join(alt_names)}"],
        issuer=ca,
    )
    client_pairs = {
        name: issue_client(directory, name, identity, ca) for name, identity in clients.items()
    }
    sa_key = directory / "service-account.key"
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{sa_key}"
    )
    sa_key.chmod(0o600)
    sa_pub = directory / "service-account.pub"
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return ClusterPki(
        ca=ca,
        apiserver=apiserver,
        service_account_key=sa_key,
        service_account_pub=sa_pub,
        clients=client_pairs,
    )
