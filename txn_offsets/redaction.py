"""Keeping secrets out of sight: :class:`Secret` (a string that never shows itself), the names of
Kafka properties and URL query parameters whose values are secret, and :func:`redact_url`.
Settings (:mod:`txn_offsets.config`) hold and render their secrets through these."""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url

__all__ = ["MASK", "SECRET_KAFKA_KEYS", "Secret", "redact_url", "secret_query_values"]

# librdkafka properties whose values must never be shown: passwords and passphrases, SASL secrets
# (JAAS config, OAUTHBEARER config and client secret, tokens) and private key material
# (``ssl.key.pem``, ``sasl.oauthbearer.assertion.private.key.pem``, the ``ssl_key`` object).
# Certificates and file locations are not secret.
SECRET_KAFKA_KEYS = re.compile(
    r"password|passphrase|secret|token|sasl\.jaas|oauthbearer\.config|key\.pem|^ssl[._]key$",
    re.IGNORECASE,
)
# database URL query parameters whose values must never be shown (password=, sslpassword=, ...)
SECRET_QUERY_KEYS = re.compile(r"password|secret|token", re.IGNORECASE)
MASK = "***"


class Secret:
    """A string that does not show itself in reprs, logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # Settings travel to Spark executors by pickle; the value must survive that trip.
        return (Secret, (self._value,))


def secret_query_values(url: URL) -> list[str]:
    """The values of the URL's secret query parameters (every value of a repeated one)."""
    values: list[str] = []
    for key, value in url.query.items():
        if SECRET_QUERY_KEYS.search(key):
            values.extend([value] if isinstance(value, str) else value)
    return values


def redact_url(url: str | URL) -> str:
    """The URL with its password, and the value of every query parameter whose name contains
    ``password``, ``secret`` or ``token`` (any case), replaced by ``***``.

    Never raises: garbage gives a placeholder that shows nothing of the input.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
        masked = {
            key: (MASK if isinstance(value, str) else tuple(MASK for _ in value))
            for key, value in parsed.query.items()
            if SECRET_QUERY_KEYS.search(key)
        }
        if masked:
            parsed = parsed.update_query_dict(masked)
        # the query is rendered URL-quoted: show the mask as *** rather than %2A%2A%2A
        return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", MASK)
    except Exception:
        return "<unparseable database URL>"
