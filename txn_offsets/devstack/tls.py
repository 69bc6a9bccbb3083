"""TLS and SASL for the embedded stack (``txn-offsets dev up --tls`` / ``make stack-up TLS=1``).

A throwaway CA and a server certificate for ``localhost`` and ``127.0.0.1`` are made once with
openssl's command line into ``<stack>/tls`` (the CA's key is deleted once it signed). PostgreSQL
gets the certificate in its data directory and ``ssl = on`` (``ALTER SYSTEM``, a reload: no
restart); its plain connections stay as they were. Kafka gets a third listener, ``SASL_SSL``
(SCRAM-SHA-512, the same certificate as a PEM keystore) beside PLAINTEXT and CONTROLLER; the
SCRAM credential of the user ``txn_offsets`` is stored in KRaft's metadata through the Admin API
(upserted on every start, so it works on a storage formatted before TLS was asked for).

Clients: ``<stack>/env`` names the verify-full database URL and a librdkafka properties file
(mode 0600: it holds the SCRAM password), see :func:`env_lines`.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from txn_offsets.errors import StackError

__all__ = [
    "SCRAM_USER",
    "TlsFiles",
    "broker_config",
    "enable_kafka",
    "enable_postgres",
    "ensure_certs",
    "env_lines",
    "listening",
]

logger = logging.getLogger(__name__)

SERVICE = "tls"
SCRAM_USER = "txn_offsets"
MECHANISM = "SCRAM-SHA-512"
_DAYS = "825"
_quiet = logging.getLogger(f"{__name__}.probe")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


@dataclass(frozen=True)
class TlsFiles:
    """The stack's certificates and the Kafka client properties file, in ``<stack>/tls``."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def key(self) -> Path:
        return self.dir / "server.key"

    @property
    def keystore(self) -> Path:
        """The server's key and certificate in one PEM file (Kafka's PEM keystore)."""
        return self.dir / "server-keystore.pem"

    @property
    def kafka_client_config(self) -> Path:
        return self.dir / "kafka-client.properties"


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise StackError(
            SERVICE, "openssl is needed to make the stack's certificates", "apt-get install openssl"
        )
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise StackError(
            SERVICE, f"openssl {args[0]} failed: {done.stderr.strip()[-400:]}", "read the message"
        )


def ensure_certs(directory: Path) -> TlsFiles:
    """The CA and the server certificate (made once; kept for later starts)."""
    files = TlsFiles(directory)
    if files.ca.exists() and files.cert.exists() and files.key.exists() and files.keystore.exists():
        return files
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        work = Path(tmp)
        (work / "server.ext").write_text(
            "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature, keyEncipherment\n"
            "extendedKeyUsage = serverAuth\nsubjectAltName = DNS:localhost, IP:127.0.0.1\n"
        )
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", _DAYS, "-subj", "/CN=txn-offsets devstack throwaway CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=work,
        )  # fmt: skip
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost", cwd=work,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", _DAYS, "-extfile", "server.ext", cwd=work,
        )  # fmt: skip
        key, cert = (work / "server.key").read_text(), (work / "server.pem").read_text()
        (work / "server-keystore.pem").write_text(key + cert)
        for name in ("server.key", "server-keystore.pem"):
            (work / name).chmod(0o600)
        for name in ("server.key", "server.pem", "server-keystore.pem", "ca.pem"):  # the CA last: the marker
            os.replace(work / name, directory / name)
    logger.info("made a throwaway CA and a server certificate for localhost/127.0.0.1 in %s", directory)
    return files


def _verify_full(port: int, user: str, password: str, dbname: str, ca: Path) -> dict[str, object]:
    return {
        "host": "127.0.0.1",
        "port": port,
        "user": user,
        "password": password,
        "dbname": dbname,
        "sslmode": "verify-full",
        "sslrootcert": str(ca),
        "connect_timeout": 5,
    }


def enable_postgres(
    files: TlsFiles, data_dir: Path, os_user: str | None, admin_conninfo: dict[str, object]
) -> None:
    """The certificate and key into the data directory (owned by the server's OS user, the key
    0600), ``ssl = on`` by ALTER SYSTEM and a reload; then wait for a verify-full connection."""
    for source, name, mode in ((files.cert, "server.crt", 0o644), (files.key, "server.key", 0o600)):
        target = data_dir / name
        shutil.copyfile(source, target)
        target.chmod(mode)
        if os_user is not None:
            entry = pwd.getpwnam(os_user)
            os.chown(target, entry.pw_uid, entry.pw_gid)
    with psycopg.connect(**admin_conninfo, autocommit=True) as conn:  # type: ignore[arg-type]
        conn.execute("ALTER SYSTEM SET ssl = 'on'")
        conn.execute("SELECT pg_reload_conf()")
    info = {**admin_conninfo, "sslmode": "verify-full", "sslrootcert": str(files.ca)}
    deadline = time.monotonic() + 15
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(**info, autocommit=True) as conn:  # type: ignore[arg-type]
                if conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (
                    True,
                ):
                    return
                last = "the connection is not encrypted"
        except psycopg.OperationalError as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        time.sleep(0.3)
    raise StackError("postgres", f"ssl = on did not take effect: {last}", "read the server log")


def client_properties(files: TlsFiles, sasl_port: int, password: str) -> None:
    """The librdkafka properties file of the SCRAM user (0600: it holds the password)."""
    text = "\n".join(
        [
            "# written by txn_offsets.devstack: the stack's SASL_SSL listener (SCRAM-SHA-512)",
            f"bootstrap.servers=127.0.0.1:{sasl_port}",
            "security.protocol=SASL_SSL",
            f"sasl.mechanism={MECHANISM}",
            f"sasl.username={SCRAM_USER}",
            f"sasl.password={password}",
            f"ssl.ca.location={files.ca}",
            "",
        ]
    )
    fd = os.open(files.kafka_client_config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def enable_kafka(files: TlsFiles, plain_bootstrap: str, sasl_port: int, password: str) -> None:
    """Store the SCRAM credential (Admin API over PLAINTEXT), write the client properties file,
    then wait until a client authenticates over SASL_SSL and reads the cluster's metadata."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import _scram as scram  # not re-exported by the package's stubs

    admin = AdminClient({"bootstrap.servers": plain_bootstrap})
    info = scram.ScramCredentialInfo(scram.ScramMechanism.SCRAM_SHA_512, 8192)
    upsert = scram.UserScramCredentialUpsertion(SCRAM_USER, info, password.encode())
    try:
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=30).values():
            future.result(timeout=35)
    except KafkaException as exc:
        raise StackError(
            "kafka", f"storing the SCRAM credential failed: {exc}", "read the broker's log"
        ) from None
    client_properties(files, sasl_port, password)
    config: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{sasl_port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": SCRAM_USER,
        "sasl.password": password,
        "ssl.ca.location": str(files.ca),
        "logger": _quiet,  # the first tries may precede the credential: expected, not worth a line
    }
    deadline = time.monotonic() + 30
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            AdminClient(config).list_topics(timeout=5)
            return
        except KafkaException as exc:
            last = str(exc.args[0]) if exc.args else type(exc).__name__
            time.sleep(0.5)
    raise StackError(
        "kafka", f"the SASL_SSL listener does not accept the SCRAM user: {last}", "read kafka.log"
    )


def env_lines(files: TlsFiles, app_url: str, sasl_port: int) -> list[str]:
    """The .stack/env lines of the TLS endpoints; `app_url` is the plain URL of the app role."""
    url = f"{app_url}?sslmode=verify-full&sslrootcert={files.ca}"
    return [
        f"TXN_OFFSETS_TLS_DATABASE_URL={url}",
        f"TXN_OFFSETS_TLS_KAFKA_BOOTSTRAP=127.0.0.1:{sasl_port}",
        f"TXN_OFFSETS_TLS_KAFKA_CONFIG={files.kafka_client_config}",
        f"TXN_OFFSETS_TLS_CA={files.ca}",
    ]


def listening(config: Path) -> bool:
    """True if the broker's server.properties has the SASL_SSL listener."""
    return config.exists() and "SASL_SSL://" in config.read_text()


def broker_config(port: int, controller_port: int, sasl_port: int, files: TlsFiles) -> tuple[str, ...]:
    """server.properties lines that add the SASL_SSL listener (they replace the same keys)."""
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return (
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
        f"SASL_SSL://127.0.0.1:{sasl_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        f"listener.name.sasl_ssl.sasl.enabled.mechanisms={MECHANISM}",
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config={scram}",
        "listener.name.sasl_ssl.ssl.keystore.type=PEM",
        f"listener.name.sasl_ssl.ssl.keystore.location={files.keystore}",
    )
