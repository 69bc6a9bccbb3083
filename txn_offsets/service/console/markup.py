"""HTML text for the console: every stored text escaped and its control characters made visible,
and the page frame (title, navigation, self-refresh, the inline style the CSP allows).

Stored texts (job names, topics, reasons, actors, hosts) are tenants' input: :func:`text` escapes
``<>&"'`` and shows each control or format character (C0/C1 controls, DEL, bidi overrides, zero
widths) as a visible ``\\xNN`` / ``\\uNNNN`` escape, so a terminal sequence or a right-to-left
override stored in a reason cannot disguise what a page shows.
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable
from datetime import datetime
from urllib.parse import quote, urlencode

__all__ = ["LOGOUT", "attr", "cell_time", "link", "page", "segment", "table", "text", "url"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1rem 2rem;color:#222}
nav a{margin-right:1rem} table{border-collapse:collapse;margin:.5rem 0 1.5rem}
th,td{border-bottom:1px solid #ddd;padding:.2rem .6rem;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums} code{background:#f4f4f4}
.running{color:#1a7f37}.lagging,.stalled,.stopped-with-lag{color:#b35900}
.fenced,.out-of-log{color:#c00;font-weight:bold}.idle,.retired,.unknown{color:#666}
.note{color:#555} .err{color:#c00} svg{vertical-align:middle}
form.inline input{margin-right:.5rem} form.logout{display:inline;float:right}
"""


def _visible(ch: str) -> str:
    if unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"} and ch not in "\t":
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def text(value: object) -> str:
    """`value` as HTML text: escaped, its control characters shown as escapes; None: a dash."""
    if value is None:
        return "-"
    raw = str(value)
    return html.escape("".join(_visible(c) for c in raw), quote=True)


def attr(value: str) -> str:
    """An attribute's value (quoted by the caller with double quotes)."""
    return html.escape(value, quote=True)


def url(path: str, **query: object) -> str:
    """A URL of the console: `path` segments already quoted by the caller, `query` encoded."""
    given = {k: v for k, v in query.items() if v is not None and v != ""}
    return path + ("?" + urlencode(given) if given else "")


def segment(value: str) -> str:
    """One path segment (a job's name), percent-encoded."""
    return quote(value, safe="")


def link(href: str, label: str) -> str:
    """An anchor; `label` is already HTML."""
    return f'<a href="{attr(href)}">{label}</a>'


def cell_time(at: datetime | None) -> str:
    return "-" if at is None else text(at.isoformat(timespec="seconds"))


def table(head: Iterable[str], rows: Iterable[Iterable[str]], numeric: frozenset[int] = frozenset()) -> str:
    """A table; the cells are already HTML, columns in `numeric` aligned right."""
    out = ["<table><thead><tr>", *(f"<th>{h}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        cells = (f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        out += ["<tr>", *cells, "</tr>"]
    out.append("</tbody></table>")
    return "".join(out)


#: the nav's logout: a POST (a link or prefetch cannot log anyone out), no script needed
LOGOUT = (
    '<form method="post" action="/console/logout" class="logout">'
    '<button type="submit">Log out</button></form>'
)


def page(title: str, body: str, *, refresh_s: int | None = 15, nav: str = "", logout: bool = False) -> str:
    """A whole page; `title` is plain text, `body` and `nav` HTML; `logout`: with the logout button
    (the visitor came in with the login's cookie)."""
    meta = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    nav += LOGOUT if logout else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"{meta}<title>{text(title)} - txn-offsets</title><style>{_STYLE}</style></head>"
        f'<body><nav><a href="/console/">Jobs</a><a href="/console/lineage">Lineage search</a>{nav}</nav>'
        f"<h1>{text(title)}</h1>{body}</body></html>"
    )
