"""Kafka client properties files (--kafka-config / TXN_OFFSETS_KAFKA_CONFIG): parsed as
kafka-consumer-groups.sh's --command-config, checked by librdkafka, secrets held as Secret and
named nowhere."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from txn_offsets.config import KafkaSettings, from_env, kafka_from_env
from txn_offsets.errors import ConfigError
from txn_offsets.properties import read_properties
from txn_offsets.redaction import Secret

SECRET = "s3cr3t-Value-42"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


def test_key_value_lines_comments_and_the_bootstrap(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# SASL_SSL\n! also a comment\n\nbootstrap.servers=b1:9093,b2:9093\nsecurity.protocol = SASL_SSL\n"
        f"sasl.mechanism: SCRAM-SHA-512\nsasl.username u1\nsasl.password={SECRET}\n",
    )
    props = read_properties(path)
    assert props.bootstrap == "b1:9093,b2:9093"
    assert props.properties["security.protocol"] == "SASL_SSL" and props.properties["sasl.username"] == "u1"
    assert props.properties["sasl.password"] == Secret(SECRET)
    assert SECRET not in repr(props)
    kafka = kafka_from_env({"TXN_OFFSETS_KAFKA_BOOTSTRAP": "env:9092"}, config_file=path)
    assert kafka.bootstrap_servers == "b1:9093,b2:9093"  # the file's, over the environment's
    assert kafka_from_env({}, bootstrap="flag:9092", config_file=path).bootstrap_servers == "flag:9092"
    assert SECRET not in repr(kafka) and SECRET not in repr(kafka.extra) and SECRET not in str(kafka)
    assert kafka.client_config()["sasl.password"] == SECRET  # in clear only for the client
    assert pickle.loads(pickle.dumps(kafka)).client_config() == kafka.client_config()  # noqa: S301 - to executors
    env = {"TXN_OFFSETS_DATABASE_URL": "postgresql://u:p@h/d", "TXN_OFFSETS_KAFKA_CONFIG": str(path)}
    assert from_env(env)[1] == kafka


def test_a_secret_given_in_code_is_held_as_secret() -> None:
    kafka = KafkaSettings("b:9092", {"sasl.password": SECRET, "ssl.key.password": SECRET})
    assert isinstance(kafka.extra["sasl.password"], Secret) and SECRET not in repr(kafka.extra)
    assert kafka.client_config()["ssl.key.password"] == SECRET


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("sasl.pasword=" + SECRET, "'sasl.pasword'"),  # unknown to librdkafka: a typo
        ("isolation.level=read_uncommitted", "'isolation.level' is managed by txn_offsets"),
        ("enable.auto.commit=true", "'enable.auto.commit' is managed by txn_offsets"),
        (
            f'sasl.jaas.config=ScramLoginModule required password="{SECRET}";',
            "give sasl.username and sasl.password",
        ),
        ("ssl.truststore.location=/x.jks", "give ssl.ca.location"),
        (f"sasl.password={SECRET}\nsasl.password={SECRET}", "'sasl.password' is set twice (lines 1 and 2)"),
        ("sasl.password=", "'sasl.password' (line 1) has no value"),
        ("=x", "line 1 has no key"),
        ("fetch.max.bytes=lots", "'fetch.max.bytes'"),
        (
            f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.password={SECRET}",
            "sasl.username and sasl.password must be set",
        ),
    ],
)
def test_bad_files_name_the_key_and_the_file_never_a_value(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as caught:
        kafka_from_env({}, bootstrap="b:9092", config_file=path)
    assert named in str(caught.value) and str(path) in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        kafka_from_env({"TXN_OFFSETS_KAFKA_CONFIG": str(tmp_path / "nope.properties")}, bootstrap="b:9092")
