"""Issue 42, item 6: a database URL whose password (or user name) holds an unencoded '@' is refused
with a one-line ConfigError that says to write it as %40 and shows the URL with nothing of the
password: parsed as it stands, the part after the '@' would be taken for the host and shown by
every connection error."""

from __future__ import annotations

import pytest

from txn_offsets.config import DatabaseSettings, database_from_env
from txn_offsets.errors import ConfigError
from txn_offsets.redaction import Secret, redact_url

# (URL, the secret parts that must not appear, what the message shows of the URL)
CASES = [
    (
        "postgresql+psycopg://app:hunter@sekret-9@db.example.com:5432/offsets",
        ["hunter", "sekret-9"],
        "postgresql+psycopg://app:***@db.example.com:5432/offsets",
    ),
    (
        "postgresql://app:a@b@c-frag/w@db.example.com/offsets",
        ["a@b", "c-frag/w"],
        "postgresql://app:***@db.example.com/offsets",
    ),
    (  # '@' and ':' in the password: it would not even parse as a port
        "postgresql+psycopg://app:pa@ss:wo-rd@db.example.com:5432/offsets",
        ["pa@ss", "wo-rd"],
        "postgresql+psycopg://app:***@db.example.com:5432/offsets",
    ),
    (  # a secret query value is masked too
        "postgresql+psycopg://app:pw@frag-q@db.example.com/offsets?sslpassword=ssl-secret&application_name=x",
        ["frag-q", "ssl-secret"],
        "postgresql+psycopg://app:***@db.example.com/offsets?application_name=x&sslpassword=***",
    ),
    (  # a '?' before the last '@': where the password ends is unclear, nothing is shown
        "postgresql+psycopg://app:p?q@frag-z@db.example.com/offsets",
        ["p?q", "frag-z", "db.example.com"],
        "postgresql+psycopg://***",
    ),
    (  # an '@' in a secret query value: its fragment after the '@' is not shown either
        "postgresql+psycopg://app:pw@db.example.com/offsets?sslpassword=ab@cd-frag",
        ["ab@cd-frag", "cd-frag"],
        "postgresql+psycopg://***",
    ),
    (  # no password: the user name's '@' (Azure's user@server) must be encoded as well
        "postgresql+psycopg://user@server@db.example.com/offsets",
        ["server@"],
        "postgresql+psycopg://***@db.example.com/offsets",
    ),
]


@pytest.mark.parametrize(("url", "hidden", "shown"), CASES)
def test_an_unencoded_at_is_refused_without_echoing_the_password(
    url: str, hidden: list[str], shown: str
) -> None:
    for given in (url, Secret(url)):
        with pytest.raises(ConfigError) as info:
            DatabaseSettings(given)
        text = str(info.value)
        assert info.value.setting == "database_url"
        assert "\n" not in text
        assert "%40" in text and "percent-encode" in text
        assert text.startswith(f"database_url: {shown} holds more than one '@'"), text
        for secret in hidden:
            assert secret not in text, (secret, text)
        assert info.value.__cause__ is None and info.value.__context__ is None  # nothing chained


def test_from_the_environment_too() -> None:
    env = {"TXN_OFFSETS_DATABASE_URL": "postgresql+psycopg://app:top@secret-7@10.1.2.3:5432/offsets"}
    with pytest.raises(ConfigError) as info:
        database_from_env(env)
    assert "secret-7" not in str(info.value) and "top" not in str(info.value)
    assert "app:***@10.1.2.3:5432/offsets" in str(info.value)


def test_the_encoded_form_is_accepted_and_means_the_password() -> None:
    db = DatabaseSettings("postgresql+psycopg://app:hunter%40sekret-9@db.example.com:5432/offsets")
    assert db.url.password == "hunter@sekret-9"
    assert db.url.host == "db.example.com"
    assert db.display_url == "postgresql+psycopg://app:***@db.example.com:5432/offsets"
    assert DatabaseSettings("postgresql+psycopg://app:pw@h/db?application_name=a%40b").url.query == {
        "application_name": "a@b"
    }


def test_one_at_is_the_usual_url() -> None:
    db = DatabaseSettings("postgresql+psycopg://app:pw@db.example.com/offsets")
    assert (db.url.username, db.url.password, db.url.host) == ("app", "pw", "db.example.com")


@pytest.mark.parametrize(("url", "hidden", "shown"), CASES)
def test_redact_url_masks_every_fragment_too(url: str, hidden: list[str], shown: str) -> None:
    """redact_url, for any caller that shows a raw URL: the same masking as the refusal's."""
    text = redact_url(url)
    assert text == shown
    for secret in hidden:
        assert secret not in text
