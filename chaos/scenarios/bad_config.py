"""Configuration faults (F11): every misconfiguration fails before the run starts and changes
nothing.
"""

from __future__ import annotations

import logging
import secrets
import socket

import sqlalchemy as sa

from chaos.job import SPARK_STARTING
from chaos.report import ScenarioResult
from chaos.scenarios.context import (
    Context,
    scenario,
    snapshot,
)

logger = logging.getLogger(__name__)


# --- F11 -----------------------------------------------------------------------------------
@scenario("F11")
def f11_bad_config(ctx: Context, messages: int, _n: int) -> ScenarioResult:
    """Bad configuration fails before any write, with a clear error that never shows a secret."""
    result = ScenarioResult("F11")
    topic, schema = ctx.topic(2), ctx.schema()
    oracle = ctx.produce(topic, max(1000, messages), 2)
    result.messages = oracle.messages
    url = sa.engine.make_url(ctx.services.database_url)
    real_password = str(url.password or "")
    wrong_password = secrets.token_urlsafe(16)
    with socket.socket() as s:  # a port nobody listens on (loopback)
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    broken_schema = ctx.schema()
    with ctx.engine.begin() as conn:
        conn.execute(sa.text(f'DROP TABLE "{broken_schema}".offsets CASCADE'))

    def bad_url(**parts: object) -> str:
        return url.set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]

    cases: list[tuple[str, dict[str, str], list[str], str, str]] = [
        # (name, env, extra args, expected error type, expected words); TopicMissing is a ConfigError
        (
            "wrong password",
            {"CHAOS_DB": bad_url(password=wrong_password)},
            [],
            "ServiceUnavailable",
            "password authentication failed",
        ),
        ("wrong host", {"CHAOS_DB": bad_url(host="127.0.0.2")}, [], "ServiceUnavailable", "127.0.0.2"),
        ("wrong port", {"CHAOS_DB": bad_url(port=free_port)}, [], "ServiceUnavailable", str(free_port)),
        ("no database URL", {"CHAOS_DB": ""}, [], "ConfigError", "database_url"),
        ("missing schema", {}, ["--schema", "chaos_missing_schema"], "SchemaMissing", "chaos_missing_schema"),
        ("missing table", {}, ["--schema", broken_schema], "SchemaMissing", broken_schema),
        ("missing topic", {}, ["--topics", "chaos-no-such-topic"], "TopicMissing", "chaos-no-such-topic"),
        ("bad limits", {}, ["--max-per-partition", "0"], "ConfigError", "max_records_per_partition"),
        ("bad data-loss policy", {}, ["--on-data-loss", "ignore"], "ConfigError", "on_data_loss"),
    ]
    before = snapshot(ctx, schema, "f11")
    for i, (name, env, extra, kind, words) in enumerate(cases):
        job = f"f11-{i}"
        args = ["--database-url-env", "CHAOS_DB"] if "CHAOS_DB" in env else []
        jp = ctx.job(
            ctx.work_dir / "F11" / f"case-{i}",
            job=job,
            schema=schema,
            topics=[topic],
            max_per_partition=1000,
            extra=[*args, *extra],
            env=env,
        )
        # argparse keeps the last value of a repeated option: the case's --schema/--topics win
        res = jp.start().wait(120)
        result.runs += 1
        result.faults += 1
        error = res.last_error()
        if res.returncode != 1 or f"chaos-job: {kind}:" not in error or words not in error:
            result.fail(f"F11 {name}: expected {kind} naming {words!r}, got exit {res.returncode}: {error!r}")
        for secret in (real_password, wrong_password):
            if secret and secret in res.log:
                result.fail(f"F11 {name}: the log shows a password")
        if SPARK_STARTING in res.log:
            result.fail(f"F11 {name}: started Spark before failing on its configuration")
        if res.seconds > 60:
            result.fail(f"F11 {name}: took {res.seconds:.0f}s to fail")
    if snapshot(ctx, schema, "f11") != before:
        result.fail("F11: a failed run changed offsets or results")
    with ctx.engine.connect() as conn:
        jobs = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".jobs')).scalar_one()
        rows = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".offsets')).scalar_one()
    if rows:
        result.fail(f"F11: {rows} offset rows were written by failing runs")
    if jobs:
        result.notes.append(
            f"{jobs} job rows (run bookkeeping, no offsets) left by runs that failed in planning"
        )
    return result
