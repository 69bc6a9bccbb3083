"""Keeping secrets out of sight: :class:`Secret` (a string that never shows itself), the names of
Kafka properties and URL query parameters whose values are secret, and :func:`redact_url`.
Settings (:mod:`txn_offsets.config`) hold and render their secrets through these."""

from __future__ import annotations

import re
from urllib.parse import quote

from sqlalchemy.engine import URL, make_url

__all__ = ["MASK", "SECRET_KAFKA_KEYS", "Secret", "has_unencoded_at", "redact_url", "secret_query_values"]

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


def has_unencoded_at(raw: str) -> bool:
    """More than one ``@`` after the scheme: a password (user name, ...) holding an ``@`` that is
    not percent-encoded (``%40``). Parsed as it stands, the part after its ``@`` is taken for the
    host, and every message naming the host would show it."""
    _, sep, rest = raw.partition("://")
    return bool(sep) and rest.count("@") > 1


def _redact_unencoded_at(raw: str) -> str:
    """`raw` (:func:`has_unencoded_at`) with everything between ``://`` and its *last* ``@`` held
    to be the user name and password (a password's ``@`` comes before the host's): the password
    and any fragment of it masked, the user name (what precedes the first ``:``) shown
    percent-encoded. With an ``@`` after a ``?`` (it may be a secret query value's) nothing but
    the scheme is shown."""
    scheme, _, rest = raw.partition("://")
    if not re.fullmatch(r"[\w+.-]+", scheme):
        return "<unparseable database URL>"
    userinfo, _, tail = rest.rpartition("@")
    if "?" in userinfo:
        return f"{scheme}://{MASK}"
    user, colon, _ = userinfo.partition(":")
    # without a ':' all of it may be password; with one, what precedes it is the user name
    shown = f"{quote(user, safe='')}:{MASK}" if colon else MASK
    return redact_url(f"{scheme}://{shown}@{tail}")  # one '@' now; secret query values masked


def redact_url(url: str | URL) -> str:
    """The URL with its password, and the value of every query parameter whose name contains
    ``password``, ``secret`` or ``token`` (any case), replaced by ``***``. A URL with more than one
    ``@`` (:func:`has_unencoded_at`) is shown with everything before its last ``@`` masked.

    Never raises: garbage gives a placeholder that shows nothing of the input.
    """
    if isinstance(url, str) and has_unencoded_at(url):
        return _redact_unencoded_at(url)
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
