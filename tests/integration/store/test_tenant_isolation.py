"""No side doors between tenants (issue 42, items 1, 2 and 5), against the real PostgreSQL.

1. The row-level security helpers (job_reachable, job_scope, jobs_owned_by, job_owned) answer only
   about roles the session may act as: a run role cannot list other tenants' jobs and owners
   through them, and a role that is no role of the store gets no answer at all; the policies keep
   working for the run role and the owner. Downgrading restores the old definitions.
2. Topic names are Kafka-legal by constraint in every table holding one, and an upgrade over
   illegal rows is refused, naming them.
3. (item 5) `db grants` and `db role` refuse PUBLIC, the role specifiers and the predefined pg_*
   roles (usage error, 64), and `db grants --apply` a role that does not exist.

Roles are made with the project's own `db role --apply` / `db grants --job --apply` (the
``make_role`` fixture of test_job_roles) and log in with their own passwords.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from tests.integration.helpers import offsets_of
from tests.unproven import commit_ranges
from txn_offsets import MigrationError
from txn_offsets.admin import grants
from txn_offsets.cli import exits
from txn_offsets.commit import Outcome
from txn_offsets.config import DatabaseSettings
from txn_offsets.errors import ConfigError
from txn_offsets.ranges import OffsetRange
from txn_offsets.redaction import Secret
from txn_offsets.store import migrate, offset_rows
from txn_offsets.store.handle import Store
from txn_offsets.store.runs import end_run, start_run

from .test_job_roles import JobRole, RunCli, as_url, make_role  # noqa: F401 - the fixtures

HELPERS = {"job_reachable(text,text)", "job_scope(text)", "jobs_owned_by(text)", "job_owned(text)"}
BAD_TOPICS = ("no'such topic", ".", "..", "a" * 250, "caf\u00e9", "tab\there", "new\nline", "end\n", "")
GOOD_TOPICS = ("t", "a.b_c-D9", "a" * 249, "...", "_")


def _refused(engine: sa.Engine, sql: str, **params: object) -> None:
    """`sql` fails with insufficient_privilege (42501), answering nothing."""
    with pytest.raises(sa.exc.ProgrammingError) as info, engine.connect() as conn:
        conn.execute(sa.text(sql), params).all()
    assert getattr(info.value.orig, "sqlstate", None) == "42501", info.value


def _one(engine: sa.Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def _run_a_batch(r: JobRole, job: str, until: int) -> None:
    run = start_run(Store(r.engine, r.db), job)
    with r.engine.begin() as conn:
        offset_rows.seed_offsets(conn, r.db, job, {("t", 0): 0}, reason="first run", actor="job")
    store = Store(r.engine, r.db)
    assert commit_ranges(store, run, [OffsetRange("t", 0, 0, until)])[0].outcome is Outcome.COMMITTED
    assert end_run(Store(r.engine, r.db), run)


@pytest.fixture
def login_role(admin_engine: sa.Engine, migrated: DatabaseSettings) -> Iterator[Callable[..., sa.Engine]]:
    """login_role(*grants): a LOGIN role made by hand with the given GRANT statements ({role} and
    {schema} filled in), and an engine logged in as it."""
    made: list[tuple[str, sa.Engine]] = []

    def make(*statements: str) -> sa.Engine:
        role, password = f"x_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
        with admin_engine.begin() as conn:
            # CREATE ROLE / GRANT take no bind parameters: generated hex and a validated schema name
            conn.execute(sa.text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"))
            for stmt in statements:
                conn.execute(sa.text(stmt.format(role=f'"{role}"', schema=f'"{migrated.schema}"')))
        url = migrated.url.set(username=role, password=password)
        made.append((role, sa.create_engine(url, poolclass=sa.pool.NullPool)))
        return made[-1][1]

    yield make
    with admin_engine.begin() as conn:
        for role, engine in made:
            engine.dispose()
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))


# -- 1. the helpers answer only about the session's own roles


def test_a_run_role_cannot_list_other_tenants_jobs_and_owners(
    make_role: Callable[..., JobRole],  # noqa: F811 - the fixture
    migrated: DatabaseSettings,
    engine: sa.Engine,
) -> None:
    q = f'"{migrated.schema}"'
    job_a, job_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    a, b = make_role(job=job_a), make_role(job=job_b)
    _run_a_batch(a, job_a, 10)
    _run_a_batch(b, job_b, 20)

    # the query of the issue: every role's jobs, one row per role of pg_roles - refused
    _refused(a.engine, f"SELECT r.rolname, {q}.jobs_owned_by(r.rolname) FROM pg_catalog.pg_roles r")
    _refused(a.engine, f"SELECT r.rolname, {q}.job_scope(r.rolname) FROM pg_catalog.pg_roles r")
    _refused(a.engine, f"SELECT {q}.job_reachable(:j, r.rolname) FROM pg_catalog.pg_roles r", j=job_b)
    # ... and each helper asked about B by name
    _refused(a.engine, f"SELECT {q}.jobs_owned_by(:r)", r=b.role)
    _refused(a.engine, f"SELECT {q}.job_scope(:r)", r=b.role)
    _refused(a.engine, f"SELECT {q}.job_reachable(:j, :r)", j=job_b, r=b.role)
    # a role that owns a job may not probe other job names either
    _refused(a.engine, f"SELECT {q}.job_owned(:j)", j=job_b)
    _refused(a.engine, f"SELECT {q}.job_owned(:j)", j="no-such-job")

    # about itself A gets the answers its policy uses
    assert _one(a.engine, f"SELECT {q}.job_scope(current_user)") == "owned"
    assert _one(a.engine, f"SELECT {q}.jobs_owned_by(current_user)") == [job_a]
    assert _one(a.engine, f"SELECT {q}.job_reachable(:j, current_user)", j=job_a) is True
    assert _one(a.engine, f"SELECT {q}.job_reachable(:j, current_user)", j=job_b) is False

    # the policies still hold and still let each role work its own job
    assert _one(a.engine, f"SELECT count(*) FROM {q}.offsets") == 1
    assert _one(a.engine, f"SELECT count(*) FROM {q}.commits WHERE job = :j", j=job_b) == 0
    with a.engine.begin() as conn:
        assert offset_rows.load_offsets(conn, a.db, job_a) == {("t", 0): 10}
    assert offsets_of(engine, migrated, job_b) == {("t", 0): 20}  # the owner sees every job


def test_the_shared_role_and_the_owner_keep_their_answers(
    make_role: Callable[..., JobRole],  # noqa: F811 - the fixture
    migrated: DatabaseSettings,
    engine: sa.Engine,
) -> None:
    """The shared run role (no job) keeps the unowned jobs; it may ask whether a job is owned (it
    could tell anyway: inserting an owned job's row is a policy violation) but not about another
    role. The owner of the schema may ask about any role."""
    q = f'"{migrated.schema}"'
    job_a, job_old = f"a-{uuid.uuid4().hex[:8]}", f"old-{uuid.uuid4().hex[:8]}"
    a, shared = make_role(job=job_a), make_role()
    _run_a_batch(shared, job_old, 5)
    _run_a_batch(a, job_a, 7)

    assert _one(shared.engine, f"SELECT {q}.job_scope(current_user)") == "unowned"
    assert _one(shared.engine, f"SELECT {q}.jobs_owned_by(current_user)") == []
    assert _one(shared.engine, f"SELECT {q}.job_owned(:j)", j=job_a) is True
    assert _one(shared.engine, f"SELECT {q}.job_owned(:j)", j=job_old) is False
    _refused(shared.engine, f"SELECT {q}.jobs_owned_by(:r)", r=a.role)
    _refused(shared.engine, f"SELECT {q}.job_scope(:r)", r=a.role)
    assert _one(shared.engine, f"SELECT count(*) FROM {q}.offsets") == 1  # its unowned job only
    with pytest.raises(sa.exc.ProgrammingError, match="row-level security"), shared.engine.begin() as conn:
        insert = f"INSERT INTO {q}.offsets (job, topic, part, off) VALUES (:j, 't', 1, 0)"
        conn.execute(sa.text(insert), {"j": job_a})

    # the schema owner: every answer, about any role
    assert _one(engine, f"SELECT {q}.jobs_owned_by(:r)", r=a.role) == [job_a]
    assert _one(engine, f"SELECT {q}.job_scope(:r)", r=shared.role) == "unowned"
    assert _one(engine, f"SELECT {q}.job_reachable(:j, :r)", j=job_a, r=a.role) is True
    assert _one(engine, f"SELECT {q}.job_owned(:j)", j=job_a) is True
    assert _one(engine, f"SELECT count(*) FROM {q}.offsets") == 2


def test_a_role_outside_the_store_gets_no_answer(
    login_role: Callable[..., sa.Engine],
    make_role: Callable[..., JobRole],  # noqa: F811 - the fixture
    migrated: DatabaseSettings,
) -> None:
    """A role with USAGE on the schema and no grant of the store (a monitoring role, say) may not
    call the helpers, not even about itself: it would learn whether jobs have owners."""
    q = f'"{migrated.schema}"'
    job_a = f"a-{uuid.uuid4().hex[:8]}"
    make_role(job=job_a)
    outsider = login_role("GRANT USAGE ON SCHEMA {schema} TO {role}")
    _refused(outsider, f"SELECT {q}.job_owned(:j)", j=job_a)
    _refused(outsider, f"SELECT {q}.job_scope(current_user)")
    _refused(outsider, f"SELECT {q}.jobs_owned_by(current_user)")
    _refused(outsider, f"SELECT {q}.job_reachable(:j, current_user)", j=job_a)


def _helper_definitions(engine: sa.Engine, schema: str) -> dict[str, tuple[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT p.oid::regprocedure::text AS sig, pg_get_functiondef(p.oid) AS source, p.proacl"
                " FROM pg_catalog.pg_proc p WHERE p.pronamespace = CAST(:s AS regnamespace)"
            ),
            {"s": f'"{schema}"'},
        ).all()
    return {r.sig.split(".", 1)[1]: (r.source, r.proacl) for r in rows}


def _check_constraints(engine: sa.Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text(
                    "SELECT conname FROM pg_catalog.pg_constraint"
                    " WHERE connamespace = CAST(:s AS regnamespace) AND contype = 'c'"
                ),
                {"s": f'"{schema}"'},
            ).scalars()
        )


LEGAL_CHECKS = {
    "offsets_topic_legal_check",
    "offset_audit_topic_legal_check",
    "dead_letters_topic_legal_check",
    "commits_topic_legal_check",
    "stream_plans_topics_legal_check",
}

RUNS_CHECKS = {"job_runs_ended_known_check", "job_runs_cause_short_check"}  # job_runs (0013)


def test_downgrade_restores_the_helpers_and_drops_the_constraints(
    engine: sa.Engine, db: DatabaseSettings
) -> None:
    assert migrate.upgrade(db, "0010") == "0010"
    before, checks = _helper_definitions(engine, db.schema), _check_constraints(engine, db.schema)
    assert set(before) == HELPERS
    assert migrate.upgrade(db) == migrate.head()
    after = {s: d for s, d in _helper_definitions(engine, db.schema).items() if s in HELPERS}
    assert {s: d for s, (d, _) in after.items()} != {s: d for s, (d, _) in before.items()}
    assert all("session_user" in d for d, _ in after.values()), after
    assert {s: acl for s, (_, acl) in after.items()} == {s: acl for s, (_, acl) in before.items()}
    assert _check_constraints(engine, db.schema) == checks | LEGAL_CHECKS | RUNS_CHECKS
    migrate.check(db)

    assert migrate.downgrade(db, "0010") == "0010"
    assert _helper_definitions(engine, db.schema) == before
    assert _check_constraints(engine, db.schema) == checks
    assert migrate.upgrade(db) == migrate.head()


# -- 2. topic names are Kafka-legal by constraint


def _insert_with_topic(conn: sa.Connection, q: str, table: str, job: str, topic: str) -> None:
    values = {"j": job, "t": topic}
    sql = {
        "offsets": "INSERT INTO {q}.offsets (job, topic, part, off) VALUES (:j, :t, 0, 0)",
        "offset_audit": "INSERT INTO {q}.offset_audit (job, topic, part, new_off, action, reason, actor)"
        " VALUES (:j, :t, 0, 0, 'seed', 'test', 'test')",
        "dead_letters": "INSERT INTO {q}.dead_letters (job, topic, part, off, error)"
        " VALUES (:j, :t, 0, 0, 'x')",
        "commits": "INSERT INTO {q}.commits (job, topic, part, from_off, until_off, generation, run_id)"
        " VALUES (:j, :t, 0, 0, 1, 1, 'r')",
        "stream_plans": "INSERT INTO {q}.stream_plans (job, generation, reader, ranges, committed)"
        " VALUES (:j, 1, 'r', CAST(:ranges AS jsonb), false)",
    }[table]
    if table == "stream_plans":
        values["ranges"] = json.dumps([["t", 0, 0, 1], [topic, 1, 0, 1, "id"]])
    conn.execute(sa.text(sql.replace("{q}", q)), values)


TABLES = ("offsets", "offset_audit", "dead_letters", "commits", "stream_plans")


@pytest.mark.parametrize("table", TABLES)
def test_every_topic_column_takes_kafka_legal_names_only(
    table: str, engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    q = f'"{migrated.schema}"'
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {q}.jobs (job) VALUES (:j)"), {"j": job_name})
    for topic in BAD_TOPICS:
        with pytest.raises(sa.exc.IntegrityError, match="check constraint") as info, engine.begin() as conn:
            if table == "stream_plans":
                conn.execute(sa.text(f"DELETE FROM {q}.stream_plans"))
            _insert_with_topic(conn, q, table, job_name, topic)
        assert getattr(info.value.orig, "sqlstate", None) == "23514", (table, topic)
    for topic in GOOD_TOPICS:
        with engine.begin() as conn:
            if table == "stream_plans":
                conn.execute(sa.text(f"DELETE FROM {q}.stream_plans"))
            _insert_with_topic(conn, q, table, job_name, topic)


def test_a_planned_range_topic_must_be_a_legal_string(
    engine: sa.Engine, migrated: DatabaseSettings, job_name: str
) -> None:
    q = f'"{migrated.schema}"'
    insert = sa.text(
        f"INSERT INTO {q}.stream_plans (job, generation, reader, ranges, committed)"
        " VALUES (:j, 1, 'r', CAST(:r AS jsonb), false)"
    )
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {q}.jobs (job) VALUES (:j)"), {"j": job_name})
    bad_plans: tuple[object, ...] = (
        [[7, 0, 0, 1]],
        [[None, 0, 0, 1]],
        [[["t"], 0, 0, 1]],
        [["t", 0, 0, 1], [{"t": 1}]],
        [["t", 0, 0, 1], "t"],
        [[]],
        {"t": [0, 0, 1]},
    )
    for ranges in bad_plans:
        with pytest.raises(sa.exc.IntegrityError, match="stream_plans_topics_legal"), engine.begin() as conn:
            conn.execute(insert, {"j": job_name, "r": json.dumps(ranges)})
    with engine.begin() as conn:  # an empty plan names no topic
        conn.execute(insert, {"j": job_name, "r": "[]"})


def test_a_tenant_cannot_write_an_illegal_topic_into_its_own_job(
    make_role: Callable[..., JobRole],  # noqa: F811 - the fixture
    migrated: DatabaseSettings,
) -> None:
    """The issue's row: a tenant's own job, topic `no'such topic`, which made serve's one Kafka
    metadata request fail for every job."""
    job = f"a-{uuid.uuid4().hex[:8]}"
    a = make_role(job=job)
    start_run(Store(a.engine, a.db), job)
    with pytest.raises(sa.exc.IntegrityError, match="offsets_topic_legal_check"), a.engine.begin() as conn:
        conn.execute(
            sa.text(f'INSERT INTO "{migrated.schema}".offsets (job, topic, part, off) VALUES (:j, :t, 0, 0)'),
            {"j": job, "t": "no'such topic"},
        )


def test_upgrade_over_illegal_topics_is_refused_naming_them(engine: sa.Engine, db: DatabaseSettings) -> None:
    assert migrate.upgrade(db, "0010") == "0010"
    q = f'"{db.schema}"'
    planted = {"offsets": "no'such topic", "commits": "\x1b[31mred", "stream_plans": "x" * 300}
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {q}.jobs (job) VALUES ('j1'), ('j2')"))
        for table, topic in planted.items():
            _insert_with_topic(conn, q, table, "j1", topic)
        _insert_with_topic(conn, q, "offset_audit", "j2", "fine.topic")

    with pytest.raises(MigrationError) as info:
        migrate.upgrade(db)
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message
    assert "offsets job 'j1' topic \"no'such topic\"" in message, message
    assert "commits job 'j1' topic '\\x1b[31mred'" in message, message
    assert f"stream_plans job 'j1' range '[\"{'x' * 78}'... (" in message, message
    assert "fine.topic" not in message and "delete those rows" in message
    assert migrate.current(db) == "0010"  # nothing changed
    assert not _check_constraints(engine, db.schema) & LEGAL_CHECKS

    with engine.begin() as conn:
        for table in planted:
            conn.execute(sa.text(f"DELETE FROM {q}.{table} WHERE job = 'j1'"))
    assert migrate.upgrade(db) == migrate.head()
    assert _check_constraints(engine, db.schema) >= LEGAL_CHECKS


# -- 5. grants refuse pseudo and predefined roles, and roles that do not exist


PSEUDO = ("public", "current_user", "session_user", "current_role", "none", "pg_monitor", "pg_read_all_data")


def _has_public_grants(engine: sa.Engine, schema: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c, aclexplode(c.relacl) a"
                    " WHERE c.relnamespace = CAST(:s AS regnamespace) AND a.grantee = 0)"
                    " OR EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n, aclexplode(n.nspacl) a"
                    " WHERE n.oid = CAST(:s AS regnamespace) AND a.grantee = 0)"
                ),
                {"s": f'"{schema}"'},
            ).scalar_one()
        )


def test_grants_to_public_are_refused_and_grant_nothing(
    as_url: Callable[[str], RunCli],  # noqa: F811 - the fixture
    admin_database_url: str,
    engine: sa.Engine,
    migrated: DatabaseSettings,
    login_role: Callable[..., sa.Engine],
    job_name: str,
) -> None:
    """The issue's attack: `db grants --role public --apply`, then a login role granted nothing
    moved an unowned job's offset from 1000 to 0."""
    s = migrated.schema
    start_run(Store(engine, migrated), job_name)
    with engine.begin() as conn:
        offset_rows.seed_offsets(conn, migrated, job_name, {("t", 0): 1000}, reason="test", actor="pytest")
    code, out, err = as_url(admin_database_url)("db", "grants", "--schema", s, "--role", "public", "--apply")
    assert code == exits.USAGE, (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "'public'" in err and "db role" in err, err
    assert not _has_public_grants(engine, s)

    nobody = login_role()  # LOGIN, granted nothing
    with pytest.raises(sa.exc.ProgrammingError, match="permission denied"), nobody.begin() as conn:
        conn.execute(sa.text(f'UPDATE "{s}".offsets SET off = 0 WHERE job = :j'), {"j": job_name})
    assert offsets_of(engine, migrated, job_name) == {("t", 0): 1000}


@pytest.mark.parametrize("role", PSEUDO)
@pytest.mark.parametrize("command", ["grants", "role"])
def test_pseudo_and_predefined_roles_are_usage_errors(
    role: str,
    command: str,
    as_url: Callable[[str], RunCli],  # noqa: F811 - the fixture
    admin_database_url: str,
    admin_engine: sa.Engine,
    migrated: DatabaseSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TXN_OFFSETS_ROLE_PASSWORD", uuid.uuid4().hex)
    run = as_url(admin_database_url)
    count = sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r")
    with admin_engine.connect() as conn:
        existed = conn.execute(count, {"r": role}).scalar()
    try:
        for apply in ([], ["--apply"]):
            code, out, err = run("db", command, "--schema", migrated.schema, "--role", role, *apply)
            assert code == exits.USAGE, (code, out, err)
            assert out == "" and len(err.strip().splitlines()) == 1 and repr(role) in err, (out, err)
        assert not _has_public_grants(admin_engine, migrated.schema)
        with admin_engine.connect() as conn:
            now = conn.execute(count, {"r": role}).scalar()
        assert now == existed  # `db role --role current_user` made no role of that name
    finally:
        _drop_roles_named_like_specifiers(admin_engine)


def test_grants_to_a_role_that_does_not_exist_name_it_and_the_fix(
    as_url: Callable[[str], RunCli],  # noqa: F811 - the fixture
    admin_database_url: str,
    admin_engine: sa.Engine,
    migrated: DatabaseSettings,
) -> None:
    missing = f"r_{uuid.uuid4().hex[:10]}"
    code, out, err = as_url(admin_database_url)(
        "db", "grants", "--schema", migrated.schema, "--role", missing, "--job", "j", "--apply"
    )
    assert code == exits.ERROR, (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert f"role '{missing}' does not exist" in err and f"db role --role {missing} --apply" in err, err
    with admin_engine.connect() as conn:  # nothing was changed: no owner row
        owners = conn.execute(sa.text(f'SELECT count(*) FROM "{migrated.schema}".job_owners')).scalar_one()
    assert owners == 0


def test_the_library_refuses_them_too(admin_engine: sa.Engine, migrated: DatabaseSettings) -> None:
    url = admin_engine.url.render_as_string(hide_password=False)
    admin = DatabaseSettings(Secret(url), schema=migrated.schema)
    try:
        for role in PSEUDO:
            with pytest.raises(ConfigError, match="role"):
                grants.apply_grants(Store(admin_engine, admin), role, job="j")
            with pytest.raises(ConfigError, match="role"):
                grants.apply_role(Store(admin_engine, admin), role, None)
        assert not _has_public_grants(admin_engine, migrated.schema)
    finally:
        _drop_roles_named_like_specifiers(admin_engine)


def _drop_roles_named_like_specifiers(admin_engine: sa.Engine) -> None:
    """What the code before 0011's checks created: a role literally named "current_user"..."""
    with admin_engine.begin() as conn:
        for role in ("current_user", "session_user", "current_role"):  # constants, quoted
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
