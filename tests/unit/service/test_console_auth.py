"""The console's login: the cookie (an HMAC of the token, HttpOnly, SameSite=Strict), the header,
refusals, the security headers; on a Starlette app of the login routes alone."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from txn_offsets.redaction import Secret
from txn_offsets.service.console.auth import COOKIE, HEADERS, ConsoleAuth

TOKEN = "unit-token-0123456789abcdef"


def _client(token: str | None) -> TestClient:
    auth = ConsoleAuth(Secret(token) if token else None)

    async def secret(request: Request) -> Response:
        return PlainTextResponse("in") if auth.allowed(request) else auth.refused(request)

    async def login(request: Request) -> Response:
        return await auth.login(request) if request.method == "POST" else auth.login_page()

    routes = [Route("/console/", secret), Route("/console/login", login, methods=["GET", "POST"])]
    return TestClient(Starlette(routes=routes), base_url="http://127.0.0.1")


def test_login_sets_a_strict_http_only_cookie_of_an_hmac() -> None:
    client = _client(TOKEN)
    assert client.get("/console/", follow_redirects=False).headers["location"] == "/console/login"
    form = client.get("/console/login")
    assert 'name="token"' in form.text and form.headers["x-frame-options"] == "DENY"
    ok = client.post("/console/login", data={"token": TOKEN}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/console/"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert TOKEN not in cookie and "Secure" not in cookie  # plain http here
    assert client.get("/console/").text == "in"


def test_wrong_token_forged_cookie_and_header() -> None:
    client = _client(TOKEN)
    wrong = client.post("/console/login", data={"token": TOKEN[:-1]}, follow_redirects=False)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert client.post("/console/login", data={"token": "x" * 5000}).status_code == 413
    client.cookies.set(COOKIE, TOKEN)  # the token itself is not the session
    assert client.get("/console/", follow_redirects=False).status_code == 303
    assert client.get("/console/", headers={"Authorization": f"Bearer {TOKEN}"}).text == "in"
    refused = client.get("/console/", headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"


def test_without_a_token_all_open_and_login_goes_home() -> None:
    client = _client(None)
    assert client.get("/console/").text == "in"
    assert client.get("/console/login", follow_redirects=False).headers["location"] == "/console/"


def test_the_policy_allows_no_script() -> None:
    csp = HEADERS["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script" not in csp and "frame-ancestors 'none'" in csp
