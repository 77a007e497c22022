"""https: bench's TLS handshake timed per connection, against a real uvicorn with a
certificate made for the test (trusted through SSL_CERT_FILE, as a user's own CA would be)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys

import pytest

from .conftest import TESTS, free_port, stop, wait_ready

pytestmark = pytest.mark.e2e
x509 = pytest.importorskip("cryptography.x509")


def certificate(tmp_path):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_file, key_file


def test_each_https_connection_has_its_tls_handshake_timed(tmp_path):
    cert_file, key_file = certificate(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "servers:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
         "--ssl-keyfile", str(key_file), "--ssl-certfile", str(cert_file)],
        cwd=TESTS, env={**os.environ, "PYTHONPATH": str(TESTS)}, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_ready(port, proc)
        out = tmp_path / "r.json"
        p = subprocess.run([sys.executable, "-m", "servescope", "bench", f"https://127.0.0.1:{port}/fast", "-c", "3", "-d", "1",
                            "--warmup", "0.2", "--json", str(out)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SSL_CERT_FILE": str(cert_file)})  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        rep = json.loads(out.read_text())
        http = rep["load"]["http"]
        assert http["connections"] >= 3 and http["tls"]["count"] == http["connections"] and http["tls"]["p50_ms"] > 0
        assert http["ttfb"]["count"] == rep["load"]["requests"]["ok"] > 10
        assert "TLS p50" in p.stdout
    finally:
        stop(proc)
