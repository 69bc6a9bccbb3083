"""The console's pages as HTML, from data already read: the jobs overview, a job's page and the
lineage search. Pure (no I/O): what to read is :mod:`~txn_offsets.service.console.routes`'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from txn_offsets.admin.console_views import DeadLetterGroup, JobLease, PartitionRow, RunRow
from txn_offsets.admin.lag import PartitionLag
from txn_offsets.admin.lineage import Explanation
from txn_offsets.admin.views import AuditRow
from txn_offsets.service.console.chart import sparkline
from txn_offsets.service.console.history import Sample
from txn_offsets.service.console.markup import attr, cell_time, link, page, segment, table, text, url
from txn_offsets.service.console.paging import Pages
from txn_offsets.service.snapshot import JobView

__all__ = [
    "JobPage",
    "LineageQuery",
    "Overview",
    "console_status",
    "job_page",
    "lineage_page",
    "overview_page",
]

PAGE_JOBS = 50
PAGE_PARTITIONS = 100
GRAFANA_UID = "txn-offsets"  # deploy/grafana/txn-offsets.json's uid


def console_status(state: str | None, lease: JobLease, lag: int | None) -> str:
    """What the overview calls a job: the service's status (the one /metrics shows) in an
    operator's words, a stopped job told apart by its lag, a retired job by its row."""
    if lease.retired_at is not None:
        return "retired"
    if state is None:
        return "unknown"  # Kafka not answering: only FENCED and STOPPED could be decided
    if state == "STOPPED":
        return "stopped with lag" if lag else "idle"
    return {"OK": "running", "LAGGING": "lagging", "STALLED": "stalled", "FENCED": "fenced"}.get(
        state, "out of log"
    )


def _status_cell(status: str) -> str:
    return f'<span class="status {status.replace(" ", "-")}">{text(status)}</span>'


def job_url(job: str) -> str:
    return f"/console/jobs/{segment(job)}"


def grafana_link(grafana: str | None, job: str | None = None) -> str:
    if grafana is None:
        return '<span class="note">Grafana: set TXN_OFFSETS_SERVE_GRAFANA_URL</span>'
    target = url(f"{grafana.rstrip('/')}/d/{GRAFANA_UID}/{GRAFANA_UID}", **{"var-txn_job": job})
    return link(target, "Grafana")


def _lag_seconds(view: JobView | None) -> float | None:
    known = [p.lag_seconds for p in view.partitions if p.lag_seconds is not None] if view else []
    return max(known) if known else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@dataclass(frozen=True)
class Overview:
    leases: Sequence[JobLease]
    views: Mapping[str, JobView]  # from the snapshot (not the retired jobs)
    statuses: Mapping[str, str]
    samples: Mapping[str, Sequence[Sample]]
    kafka_error: str | None = None
    grafana: str | None = None
    page: int = 1
    age_s: float = 0.0  # of the snapshot shown
    logout: bool = False  # the logout button (signed in with the login's cookie)


def overview_page(o: Overview) -> str:
    pages = Pages(len(o.leases), PAGE_JOBS, o.page)
    rows = []
    for lease in o.leases[pages.offset : pages.offset + PAGE_JOBS]:
        view = o.views.get(lease.job)
        lag = view.total_lag if view is not None and view.partitions else None
        status = console_status(o.statuses.get(lease.job), lease, lag)
        run = "-" if lease.run_id is None else f"{text(lease.run_id)} on {text(lease.run_host)}"
        rows.append(
            [
                link(job_url(lease.job), text(lease.job)),
                _status_cell(status),
                str(lease.generation),
                run if lease.live else f'<span class="note">{run}</span>',
                cell_time(lease.lease_until) if lease.live else "-",
                cell_time(lease.last_commit_at),
                "-" if lag is None else str(lag),
                _seconds(_lag_seconds(view)),
                sparkline(o.samples.get(lease.job, ())),
                "-" if view is None else str(len(view.stored)),
            ]
        )
    head = ["Job", "Status", "Generation", "Live run", "Lease until", "Last commit", "Lag (records)"]
    head += ["Lag (s)", "Lag, last hour", "Partitions"]
    note = f'<p class="err">Kafka: {text(o.kafka_error)}</p>' if o.kafka_error else ""
    body = (
        f"{note}<p>{len(o.leases)} job(s); lag and status as of {o.age_s:.0f} s ago. "
        f"{grafana_link(o.grafana)} (every job). Refreshes every 15 s; the charts are this "
        "service's own samples (since it started, at most an hour).</p>"
        + table(head, rows, frozenset({2, 6, 7, 9}))
        + pages.links("/console/")
    )
    return page("Jobs", body, logout=o.logout)


@dataclass(frozen=True)
class JobPage:
    lease: JobLease
    status: str | None  # the service's status last decided for it (None: none yet)
    partitions: Sequence[PartitionRow]
    lags: Mapping[tuple[str, int], PartitionLag]  # of those rows, where Kafka answered
    total_partitions: int
    runs: Sequence[RunRow]
    audit: Sequence[AuditRow]
    dead: Sequence[DeadLetterGroup]
    dead_total: int
    samples: Sequence[Sample]
    kafka_error: str | None = None
    grafana: str | None = None
    page: int = 1
    logout: bool = False


def job_page(p: JobPage) -> str:
    lease, job = p.lease, p.lease.job
    lag = sum(x.lag for x in p.lags.values()) if p.lags else None
    status = console_status(p.status, lease, None if p.status != "STOPPED" else lag or None)
    facts = table(
        ["Status", "Generation", "Run", "Host", "Lease until", "Last commit", "Lag, last hour"],
        [
            [
                _status_cell(status),
                str(lease.generation),
                text(lease.run_id) + ("" if lease.live else ' <span class="note">(no live lease)</span>'),
                text(lease.run_host) if lease.run_id is not None else "-",
                cell_time(lease.lease_until) if lease.live else "-",
                cell_time(lease.last_commit_at),
                sparkline(p.samples),
            ]
        ],
    )
    links = " ".join(
        [
            grafana_link(p.grafana, job),
            link(url("/console/lineage", job=job), "Lineage search"),
        ]
    )
    note = f'<p class="err">Kafka: {text(p.kafka_error)}</p>' if p.kafka_error else ""
    pages = Pages(p.total_partitions, PAGE_PARTITIONS, p.page)
    parts = []
    for row in p.partitions:
        known = p.lags.get((row.topic, row.partition))
        search = url("/console/lineage", job=job, topic=row.topic, partition=row.partition)
        parts.append(
            [
                text(row.topic),
                link(search, str(row.partition)),
                str(row.offset),
                "-" if known is None else str(known.log_start),
                "-" if known is None else str(known.end),
                "-" if known is None else (text("out of log") if known.out_of_log else str(known.lag)),
                "-" if known is None else _seconds(known.lag_seconds),
                text(row.topic_id),
                cell_time(row.updated_at),
            ]
        )
    part_head = ["Topic", "Partition", "Stored offset", "Log start", "End", "Lag", "Lag (s)"]
    part_head += ["Topic incarnation", "Moved at"]
    runs = table(
        ["Run", "Generation", "First commit", "Last commit", "Commits", "Offsets", "How it ended"],
        [
            [
                text(r.run_id),
                str(r.generation),
                cell_time(r.first_commit_at),
                cell_time(r.last_commit_at),
                str(r.commits),
                str(r.offsets),
                text(r.ended),
            ]
            for r in p.runs
        ],
        frozenset({1, 4, 5}),
    )
    audit = table(
        ["At", "Action", "Topic", "Partition", "Old", "New", "Generation", "Actor", "Reason"],
        [
            [
                cell_time(a.at),
                text(a.action),
                text(a.topic),
                str(a.partition),
                text(a.old),
                str(a.new),
                text(a.generation),
                text(a.actor),
                text(a.reason),
            ]
            for a in p.audit
        ],
    )
    dead = table(
        ["Topic", "Partition", "Dead letters", "First offset", "Last offset", "Newest at"],
        [
            [
                text(d.topic),
                str(d.partition),
                str(d.count),
                str(d.first_offset),
                str(d.last_offset),
                cell_time(d.newest_at),
            ]
            for d in p.dead
        ],
        frozenset({2, 3, 4}),
    )
    body = (
        f"{note}{facts}<p>{links}</p>"
        f"<h2>Partitions ({p.total_partitions})</h2>"
        + table(part_head, parts, frozenset({2, 3, 4, 5, 6}))
        + pages.links(job_url(job))
        + f"<h2>Runs</h2>{runs if p.runs else '<p>No run recorded.</p>'}"
        + '<p class="note">How each run ended is recorded by the store (its newest 1,000 generations); '
        "a failure shows its error's class and a one-line cause that never quotes a record. A run marked "
        "<i>not recorded</i> started before the store recorded it.</p>"
        + f"<h2>History (newest {len(p.audit)})</h2>"
        + (audit if p.audit else "<p>No reset, import, skip, prune or retire.</p>")
        + f"<h2>Dead letters ({p.dead_total})</h2>"
        + (dead if p.dead else "<p>None.</p>")
        + '<p class="note">Counts and offsets only: <code>txn-offsets</code> never shows payloads here.</p>'
        + "<h2>Lineage search</h2>"
        + lineage_form(LineageQuery(job=job))
    )
    return page(f"Job {job}", body, logout=p.logout)


@dataclass(frozen=True)
class LineageQuery:
    job: str = ""
    topic: str = ""
    partition: str = ""
    offset: str = ""


def lineage_form(q: LineageQuery) -> str:
    def field(name: str, label: str, value: str, kind: str = "text") -> str:
        extra = ' min="0"' if kind == "number" else ""
        shown = attr(value)
        return f'<label>{label} <input type="{kind}" name="{name}" value="{shown}"{extra} required></label>'

    return (
        '<form method="get" action="/console/lineage" class="inline">'
        + field("job", "Job", q.job)
        + field("topic", "Topic", q.topic)
        + field("partition", "Partition", q.partition, "number")
        + field("offset", "Offset", q.offset, "number")
        + '<button type="submit">Find</button></form>'
    )


def lineage_page(
    q: LineageQuery, found: Explanation | None, error: str | None, *, logout: bool = False
) -> str:
    out = [lineage_form(q)]
    if error is not None:
        out.append(f'<p class="err">{text(error)}</p>')
    if found is not None:
        out.append(f'<p class="verdict {attr(found.verdict)}">{text(found.message())}</p>')
        if found.commits:
            out.append(
                table(
                    ["Run", "Generation", "Batch", "Range", "Committed at", "Records from", "Records to"],
                    [
                        [
                            text(c.run_id),
                            text(c.generation),
                            text(c.batch),
                            text(f"[{c.old}, {c.new})"),
                            cell_time(c.at),
                            cell_time(c.first_record_at),
                            cell_time(c.last_record_at),
                        ]
                        for c in found.commits
                    ],
                )
            )
        out.append(f"<p>{link(job_url(found.job), 'Job ' + text(found.job))}</p>")
    return page("Lineage search", "".join(out), refresh_s=None, logout=logout)
