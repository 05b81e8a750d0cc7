"""The Redis connection outside embedded mode: TLS (rediss://) with a self-signed certificate."""

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from broker.app.cli.main import app
from broker.domain.errors import StoreUnavailableError
from broker.store.jobs import Store
from conftest import free_port, start_redis


def self_signed(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 signed by its own key: (cert path, key path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker-test-redis")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "redis.crt", directory / "redis.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.fixture
def tls_redis(tmp_path):
    """A redis-server with a TLS port and a password; (TLS port, CA file)."""
    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    proc, _ = start_redis(
        tmp_path,
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        key,
        "--tls-ca-cert-file",
        cert,
        "--tls-auth-clients",
        "no",
        password="s3cret",
    )
    yield tls_port, cert
    proc.terminate()
    proc.wait(timeout=10)


def test_rediss_url_with_the_ca_works_end_to_end(tls_redis, tmp_path, monkeypatch):
    port, ca = tls_redis
    url = f"rediss://:s3cret@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    store = Store(url)
    assert store.redis.connection_pool.connection_class.__name__ == "SSLConnection"
    monkeypatch.setenv("BROKER_REDIS_URL", url)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: tls-job\nrun: [python, -c, pass]\nresources: {accelerators: [A100:1]}\nwork: {gpu_hours: 1}\n"
    )
    submitted = CliRunner().invoke(app, ["submit", str(spec), "--json"])
    assert submitted.exit_code == 0, submitted.output
    assert [j.spec.name for j in store.list_jobs()] == ["tls-job"]  # written over TLS by the CLI, read back over TLS
    assert "s3cret" not in submitted.output


def test_an_untrusted_certificate_or_a_plain_client_is_refused_in_one_line(tls_redis):
    port, _ = tls_redis
    with pytest.raises(StoreUnavailableError, match="certificate verify failed") as refused:
        Store(f"rediss://:s3cret@127.0.0.1:{port}/0")  # the system CAs do not trust a self-signed certificate
    assert "\n" not in str(refused.value) and "s3cret" not in str(refused.value)
    with pytest.raises(StoreUnavailableError):
        Store(f"redis://:s3cret@127.0.0.1:{port}/0")  # plain text to a TLS port


def test_a_redis_off_this_machine_without_a_password_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BROKER_REDIS_URL", "redis://10.1.2.3:6379/0")  # never contacted: refused before connecting
    refused = CliRunner().invoke(app, ["list"])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert "BROKER_REDIS_URL: no password for the Redis on 10.1.2.3" in refused.output
