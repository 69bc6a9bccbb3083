"""Who may see the console, and the headers every console answer carries.

With a token (``TXN_OFFSETS_SERVE_TOKEN``) a request shows it as for /offsets
(``Authorization: Bearer <token>``) or carries the session cookie the login form sets: an HMAC
of the token (never the token itself), ``HttpOnly`` (no script reads it), ``SameSite=Strict``
(no other site's page sends it), ``Secure`` when the request came over HTTPS. Every comparison
is constant-time, and neither the token nor the cookie is ever logged. Without a token the
console is open, and ``serve`` answers only loopback Host names (as for /offsets).

The headers: a Content-Security-Policy that allows nothing but the page's own inline style and
forms posting to itself (no script, no frame, no other origin), ``frame-ancestors 'none'``
(no framing: clickjacking), ``nosniff``, no referrer, no caching.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from txn_offsets.redaction import Secret
from txn_offsets.service.console.markup import page

__all__ = ["COOKIE", "HEADERS", "ConsoleAuth"]

COOKIE = "txn_offsets_console"
MAX_FORM_BYTES = 4096
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _form(message: str = "") -> str:
    note = f'<p class="err">{message}</p>' if message else ""
    body = (
        f"{note}<p>This service has a token (<code>TXN_OFFSETS_SERVE_TOKEN</code>): give it to see "
        'the console.</p><form method="post" action="/console/login" class="inline">'
        '<label>Token <input type="password" name="token" autocomplete="current-password" '
        'required></label><button type="submit">Log in</button></form>'
    )
    return page("Log in", body, refresh_s=None)


class ConsoleAuth:
    """The checks for one service's token (None: no token, everything allowed)."""

    def __init__(self, token: Secret | None) -> None:
        self._token = token
        self._session = (
            None
            if token is None
            else hmac.new(token.get().encode(), b"txn-offsets console session", hashlib.sha256).hexdigest()
        )

    @property
    def needed(self) -> bool:
        return self._token is not None

    def allowed(self, request: Request) -> bool:
        if self._token is None or self._session is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self._token.get().encode()
        ):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._session.encode())

    def signed_in(self, request: Request) -> bool:
        """Whether `request` came with the login's cookie (a token set): its pages get a logout."""
        if self._session is None:
            return False
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self._session.encode())

    def login_page(self) -> Response:
        if not self.needed:
            return RedirectResponse("/console/", status_code=303, headers=HEADERS)
        return HTMLResponse(_form(), headers=HEADERS)

    async def login(self, request: Request) -> Response:
        """The form's POST: the session cookie and back to the jobs, or 401 and the form again."""
        if self._token is None or self._session is None:
            return RedirectResponse("/console/", status_code=303, headers=HEADERS)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return HTMLResponse(_form("The form was too large."), status_code=413, headers=HEADERS)
        given = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        if not hmac.compare_digest(given.encode(), self._token.get().encode()):
            return HTMLResponse(_form("Wrong token."), status_code=401, headers=HEADERS)
        response = RedirectResponse("/console/", status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            self._session,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/console",
        )
        return response

    def logout(self) -> Response:
        response = RedirectResponse("/console/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return response

    def refused(self, request: Request) -> Response:
        """401: a browser is sent to the login form, a client that sent a header is told why."""
        if "authorization" in request.headers:
            return HTMLResponse(
                page("Wrong token", "<p>Missing or wrong bearer token.</p>", refresh_s=None),
                status_code=401,
                headers={**HEADERS, "WWW-Authenticate": "Bearer"},
            )
        return RedirectResponse("/console/login", status_code=303, headers=HEADERS)
