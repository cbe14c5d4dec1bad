"""The meaning of each piece of Django's transaction internals the library relies on
(``protocol.transactions``), pinned on the real connection: run on every Django version of
the matrix (noxfile.py's smoke subset), so that a release that changes one fails here."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import TestCase

from django_idempotency.protocol import transactions

from ..testapp.models import SideEffect


@pytest.mark.django_db(transaction=True)
def test_the_outermost_block_starts_the_transaction() -> None:
    assert transactions.starts_transaction(connection)
    with transaction.atomic():
        assert not transactions.starts_transaction(connection)
    connection.set_autocommit(False)
    try:
        assert not transactions.starts_transaction(connection)  # a transaction by hand
    finally:
        connection.rollback()
        connection.set_autocommit(True)


@pytest.mark.django_db(transaction=True)
def test_a_failed_statement_in_a_block_without_savepoint_marks_the_transaction() -> None:
    with transaction.atomic():
        assert transactions.will_commit(connection)
        assert not transactions.marked_for_rollback(connection)
        with (
            pytest.raises(DatabaseError),
            transaction.atomic(savepoint=False),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT * FROM no_such_table_anywhere")
        assert transactions.marked_for_rollback(connection)
        assert not transactions.will_commit(connection)


@pytest.mark.django_db(transaction=True)
def test_commit_hooks_taken_do_not_run_at_commit_and_run_when_given_back() -> None:
    ran: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append("view"))
        hooks = transactions.take_commit_hooks(connection)
        assert len(hooks) == 1
    assert ran == []  # the COMMIT ran none
    transaction.on_commit(lambda: ran.append("late"))  # autocommit: runs at once
    transactions.run_commit_hooks(connection, hooks)
    assert ran == ["late", "view"]
    assert connection.run_on_commit == []


@pytest.mark.django_db(transaction=True)
def test_savepoints_line_up_with_the_blocks_inside_the_outermost() -> None:
    with transaction.atomic():
        assert transactions.open_savepoints(connection) == set()
        with transaction.atomic(), transaction.atomic(savepoint=False):
            (sid,) = transactions.open_savepoints(connection)
            blocks = connection.atomic_blocks
            assert len(blocks) == 3
            assert connection.savepoint_ids == [sid, None]
    assert transactions.testcase_commit_point(connection) is None  # no TestCase here
    assert transactions.innermost_testcase_block(connection) is None


class TestInsideATestCase(TestCase):
    """A ``TestCase``'s blocks are marked; the project's first block inside them is where
    production would COMMIT, and its savepoint is the commit point."""

    def test_the_testcase_blocks_and_the_commit_point(self) -> None:
        blocks: list[Any] = connection.atomic_blocks
        assert blocks and all(transactions.from_testcase(block) for block in blocks)
        assert transactions.testcase_commit_point(connection) is None
        assert transactions.innermost_testcase_block(connection) is blocks[-1]
        with transaction.atomic():
            point = transactions.testcase_commit_point(connection)
            assert point is not None and point in transactions.open_savepoints(connection)
            assert transactions.only_testcase_outside(connection)
            with transaction.atomic():
                assert transactions.testcase_commit_point(connection) == point
                assert not transactions.only_testcase_outside(connection)
            SideEffect.objects.create(label="charge")
        assert SideEffect.objects.count() == 1  # released, not committed: the test rolls back
