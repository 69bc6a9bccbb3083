"""Pagination of the console's long lists: the page asked for (``?page=N``, 1-based), clamped to
the pages there are, and the links to the others."""

from __future__ import annotations

from dataclasses import dataclass

from txn_offsets.service.console.markup import link, text, url

__all__ = ["Pages", "page_number"]


def page_number(raw: str | None) -> int:
    """The page asked for: 1 for a missing or malformed value (a page is never an error)."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        return 1
    return max(1, int(raw))


@dataclass(frozen=True)
class Pages:
    """`total` items in pages of `size`; `asked`, the page asked for, clamped."""

    total: int
    size: int
    asked: int = 1

    @property
    def count(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def current(self) -> int:
        return min(max(1, self.asked), self.count)

    @property
    def offset(self) -> int:
        return (self.current - 1) * self.size

    def links(self, path: str, **query: object) -> str:
        """ "Page i of n" with first/previous/next/last links (none when one page holds it all)."""
        if self.count == 1:
            return ""
        n, i = self.count, self.current
        first = self.offset + 1
        last = min(self.total, self.offset + self.size)
        parts = [f"{first}-{last} of {self.total} (page {i} of {n})"]
        for label, target in (("first", 1), ("previous", i - 1), ("next", i + 1), ("last", n)):
            if 1 <= target <= n and target != i:
                parts.append(link(url(path, **query, page=target), text(label)))
        return '<p class="pages">' + " ".join(parts) + "</p>"
