"""A private certificate authority for TLS tests, made with the ``openssl`` CLI.

``TlsFiles.generate(directory)`` writes a self-signed CA, a server certificate for
``127.0.0.1`` and ``localhost`` (in its subjectAltName, so that hostname checking passes),
and a client certificate for mutual TLS, all signed by that CA, plus a second, unrelated
CA that trusts none of them (to prove that verification really happens).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _self_signed_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN=django-idempotency test {name}",
        "-keyout", str(key), "-out", str(cert),
        cwd=directory,
    )  # fmt: skip
    return key, cert


def _signed(
    directory: Path, name: str, ca: tuple[Path, Path], extensions: str
) -> tuple[Path, Path]:
    """A key and a certificate for ``name`` signed by ``ca`` with ``extensions``."""
    key, csr, cert = (directory / f"{name}{ext}" for ext in (".key", ".csr", ".pem"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions + "\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(csr),
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext_file), "-out", str(cert),
        cwd=directory,
    )  # fmt: skip
    return key, cert


@dataclass(frozen=True)
class TlsFiles:
    """The paths of one generated CA, its server and client certificates, and another CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    @classmethod
    def generate(cls, directory: Path) -> TlsFiles:
        ca = _self_signed_ca(directory, "ca")
        server_key, server_cert = _signed(
            directory,
            "server",
            ca,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        )
        client_key, client_cert = _signed(directory, "client", ca, "extendedKeyUsage=clientAuth")
        _other_key, other_ca = _self_signed_ca(directory, "other-ca")
        return cls(ca[1], server_cert, server_key, client_cert, client_key, other_ca)
