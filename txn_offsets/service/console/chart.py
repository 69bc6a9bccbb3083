"""The lag-over-time sparkline: an inline SVG drawn on the server from the service's samples, so
a growing lag shows at a glance without JavaScript."""

from __future__ import annotations

from collections.abc import Sequence

from txn_offsets.service.console.history import Sample

__all__ = ["POINTS", "sparkline"]

POINTS = 80  # at most: an hour of samples a second is thinned to this many (each the max of its run)


def _thinned(samples: Sequence[Sample], points: int) -> list[Sample]:
    """At most `points` samples: consecutive runs merged, each keeping its last time and its
    highest lag (a peak is never thinned away); the first and the last sample kept as they are."""
    if len(samples) <= points:
        return list(samples)
    step = -(-len(samples) // points)
    out = [samples[0]]
    for i in range(1, len(samples) - 1, step):
        run = samples[i : min(i + step, len(samples) - 1)]
        out.append((run[-1][0], max(lag for _t, lag in run)))
    out.append(samples[-1])
    return out


def sparkline(samples: Sequence[Sample], *, width: int = 160, height: int = 32) -> str:
    """An ``<svg>`` of lag (records) over time; a dash with fewer than two samples. The line goes
    red when the newest sample is above the oldest one."""
    if len(samples) < 2:
        return '<span class="note">-</span>'
    samples = _thinned(samples, POINTS)
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(lag for _t, lag in samples) or 1
    span = (t1 - t0) or 1.0
    pad = 2
    points = " ".join(
        f"{pad + (t - t0) / span * (width - 2 * pad):.1f},{height - pad - lag / top * (height - 2 * pad):.1f}"
        for t, lag in samples
    )
    growing = samples[-1][1] > samples[0][1]
    colour = "#c00" if growing else "#1a7f37"
    minutes = (t1 - t0) / 60
    label = f"lag from {samples[0][1]} to {samples[-1][1]} records over {minutes:.0f} min (max {top})"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'class="{"growing" if growing else "steady"}" viewBox="0 0 {width} {height}">'
        f"<title>{label}</title>"
        f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/></svg>'
    )
