"""The claim's commit mode: asynchronous for the claim's own transaction, durable for the rest.

On PostgreSQL the claim and the takeover, in autocommit, set ``synchronous_commit = off``
for their own transaction inside the statement (no round trip of its own). Triggers on the
key table and on the test view's table record, for every row written, the setting in effect
in the writing transaction, that transaction's id and the connection's backend: the claim's
row is written with ``off``, the view's rows and the completion with ``on`` in another
transaction of the same connection, and every later statement on the connection sees
``on``. A claim inside a transaction keeps that transaction's setting. That the setting
really skips the flush, and what a crash does then, is tested on a private server in
``tests/system/test_crash_recovery.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_idempotency import strategies
from django_idempotency.models import IdempotencyKey
from django_idempotency.protocol.replay import StoredResponse
from django_idempotency.store.records import ClaimState
from django_idempotency.store.sql.postgresql import ASYNC_COMMIT
from django_idempotency.store.sql.statements import statements

from ...support.api import token_client
from ...support.factories import UserFactory
from ...testapp.models import SideEffect

KEYS = IdempotencyKey._meta.db_table
EFFECTS = SideEffect._meta.db_table
RESPONSE = StoredResponse(201, {"Content-Type": "application/json"}, b"{}")

LOG_TABLE = "idem_test_commit_log"
LOG_FUNCTION = "idem_test_log_commit_mode"


@dataclass(frozen=True)
class Write:
    """One row written: its table, the operation, ``synchronous_commit`` in effect in the
    writing transaction, that transaction's id and the connection's backend pid."""

    table: str
    op: str
    synchronous_commit: str
    xid: int
    backend: int


def _show(alias: str = "default") -> tuple[str, int]:
    """``synchronous_commit`` on the connection now, and its backend pid."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit'), pg_backend_pid()")
        setting, pid = cursor.fetchone()
    return str(setting), int(pid)


@pytest.fixture
def commit_log(transactional_db: None) -> Iterator[list[Write]]:
    """Record every row written to the key table and the test view's table (see
    :class:`Write`); the list is filled in at the end of the block from the log table.
    The triggers, their function and the table are dropped afterwards."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {LOG_TABLE} (id bigserial PRIMARY KEY, tbl text, op text, "
            "mode text, xid bigint, backend int)"
        )
        cursor.execute(
            f"CREATE FUNCTION {LOG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO {LOG_TABLE} (tbl, op, mode, xid, backend) VALUES (TG_TABLE_NAME, "
            "TG_OP, current_setting('synchronous_commit'), txid_current(), pg_backend_pid()); "
            "RETURN NULL; END $$"
        )
        for table in (KEYS, EFFECTS):
            cursor.execute(
                f"CREATE TRIGGER idem_test_log AFTER INSERT OR UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {LOG_FUNCTION}()"
            )
    writes: list[Write] = []
    try:
        yield writes
    finally:
        with connections["default"].cursor() as cursor:
            for table in (KEYS, EFFECTS):
                cursor.execute(f"DROP TRIGGER IF EXISTS idem_test_log ON {table}")
            cursor.execute(f"DROP FUNCTION IF EXISTS {LOG_FUNCTION}()")
            cursor.execute(f"DROP TABLE IF EXISTS {LOG_TABLE}")


def _writes(log: list[Write]) -> list[Write]:
    """The rows logged so far (and keep them in ``log``)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT tbl, op, mode, xid, backend FROM {LOG_TABLE} ORDER BY id")
        log[:] = [Write(*row) for row in cursor.fetchall()]
    return list(log)


@pytest.fixture
def fresh_strategies() -> Iterator[None]:
    strategies.reset()
    yield
    strategies.reset()


def _claim(key: str, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"ttl": 3600, "lock_timeout": 30}
    options.update(kwargs)
    return IdempotencyKey.objects.claim("user:1", key, "f" * 64, **options)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_request_commits_its_claim_asynchronously_and_its_view_durably(
    commit_log: list[Write], fresh_strategies: None, settings: Any
) -> None:
    settings.IDEMPOTENCY = {"STRATEGY": "db"}
    client = token_client(UserFactory())
    response = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-mode")
    assert response.status_code == 201

    claim, effect, completion = _writes(commit_log)
    assert (claim.table, claim.op, claim.synchronous_commit) == (KEYS, "INSERT", "off")
    assert (effect.table, effect.op, effect.synchronous_commit) == (EFFECTS, "INSERT", "on")
    assert (completion.table, completion.op) == (KEYS, "UPDATE")
    assert completion.synchronous_commit == "on"
    # The view's row and the completion: one transaction, another than the claim's, on the
    # same connection.
    assert effect.xid == completion.xid != claim.xid
    assert claim.backend == effect.backend == completion.backend


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_setting_ends_with_the_claims_transaction(commit_log: list[Write]) -> None:
    assert connections["default"].get_autocommit()
    claimed = _claim("k-after")
    assert claimed.state is ClaimState.CLAIMED
    (claim,) = _writes(commit_log)
    assert claim.synchronous_commit == "off"

    # The next statements on the same connection, in autocommit and in a transaction.
    assert _show() == ("on", claim.backend)
    with transaction.atomic():
        assert _show() == ("on", claim.backend)
        SideEffect.objects.create(label="after-claim")
        assert IdempotencyKey.objects.complete(claimed.pk, claimed.token, RESPONSE, ttl=60)
    assert IdempotencyKey.objects.renew(claimed.pk, claimed.token) is False  # completed
    _claim("k-after")  # a replay: the loser's statements write nothing

    _claim_row, effect, completion = _writes(commit_log)
    assert [effect.synchronous_commit, completion.synchronous_commit] == ["on", "on"]
    assert effect.xid == completion.xid != claim.xid
    assert effect.backend == completion.backend == claim.backend


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_takeover_of_a_stale_claim_commits_asynchronously(commit_log: list[Write]) -> None:
    first = _claim("k-stale", lock_timeout=5)
    IdempotencyKey.objects.filter(pk=first.pk).update(
        locked_at=timezone.now() - timedelta(seconds=60)
    )
    taken = _claim("k-stale", lock_timeout=5)
    assert taken.state is ClaimState.CLAIMED and taken.taken_over and taken.pk == first.pk

    claim, aged, takeover = _writes(commit_log)
    assert (claim.op, claim.synchronous_commit) == ("INSERT", "off")
    assert (aged.op, aged.synchronous_commit) == ("UPDATE", "on")  # the test's own UPDATE
    assert (takeover.op, takeover.synchronous_commit) == ("UPDATE", "off")
    assert _show() == ("on", takeover.backend)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_inside_a_transaction_leaves_its_commit_durable(commit_log: list[Write]) -> None:
    """Nested in an outer ``atomic``, the claim commits with the outer transaction: the
    statement must not turn that commit (the view's writes with it) asynchronous."""
    with transaction.atomic():
        claimed = _claim("k-nested", lock_timeout=5)
        assert claimed.state is ClaimState.CLAIMED
        assert _show()[0] == "on"
        IdempotencyKey.objects.filter(pk=claimed.pk).update(
            locked_at=timezone.now() - timedelta(seconds=60)
        )
        assert _claim("k-nested", lock_timeout=5).taken_over
        assert _show()[0] == "on"
        SideEffect.objects.create(label="nested")
    writes = _writes(commit_log)
    assert [w.op for w in writes] == ["INSERT", "UPDATE", "UPDATE", "INSERT"]
    assert {w.synchronous_commit for w in writes} == {"on"}
    assert len({w.xid for w in writes}) == 1


@pytest.mark.parametrize("alias", ["default", "sqlite"])
def test_only_postgresql_statements_carry_the_commit_mode(alias: str) -> None:
    """The statements are composed without a query: no database access."""
    connection = connections[alias]
    sql = statements(connection)
    if connection.vendor != "postgresql":
        # SQLite: one statement for both cases, without the subquery.
        assert sql.claim is sql.claim_in_transaction
        assert sql.take_over is sql.take_over_in_transaction
        assert "set_config" not in sql.claim.sql + sql.take_over.sql
        return
    pairs = [(sql.claim, sql.claim_in_transaction), (sql.take_over, sql.take_over_in_transaction)]
    for fast, plain in pairs:
        assert fast.sql.count(ASYNC_COMMIT) == 1
        assert fast.sql.replace(ASYNC_COMMIT, "") == plain.sql
        assert fast.param_slots == plain.param_slots
    # Every other statement (the completion, renewal, release...) keeps the server's setting.
    others = [sql.complete, sql.renew, sql.release, sql.store, sql.read, sql.claim_read]
    assert all(s is not None and "set_config" not in s.sql for s in others)
