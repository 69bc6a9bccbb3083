"""Which Host headers `serve` answers without a token (DNS rebinding): loopback names only, with
or without a port; anything else, malformed or missing is refused."""

from __future__ import annotations

import pytest

from txn_offsets.service.app import loopback_host


@pytest.mark.parametrize(
    "header",
    [
        "localhost",
        "localhost:9478",
        "LocalHost:1",
        "127.0.0.1",
        "127.0.0.1:9478",
        "127.1.2.3:80",
        "[::1]",
        "[::1]:9478",
        "[::ffff:127.0.0.1]:9478",
    ],
)
def test_loopback_names_are_answered(header: str) -> None:
    assert loopback_host(header)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "evil.example",
        "evil.example:9478",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "localhost:",  # a port without digits
        "localhost:abc",
        "localhost:123456",
        "localhost:\uff19\uff14\uff17\uff18",  # fullwidth digits: not ASCII
        "localhost:9478:1",
        "localhost]",
        "[localhost]",
        "[127.0.0.1]",  # IPv4 does not go in brackets
        "[::1",
        "[::1]x",
        "[fe80::1%25lo]",
        "::1",  # IPv6 without brackets
        " localhost",
        "0.0.0.0",  # noqa: S104 - a Host header, nothing bound
        "10.0.0.1:9478",
        "[::]",
        "[::2]",
        "2130706433",  # 127.0.0.1 as a number: browsers send the dotted form
    ],
)
def test_other_names_are_refused(header: str | None) -> None:
    assert not loopback_host(header)
