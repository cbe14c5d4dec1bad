"""What the library reads and changes of Django's transaction internals, in one place.

Django documents ``atomic()``, ``on_commit()`` and ``set_rollback()``, not the state behind
them; the lifecycle needs a little of that state to know when a response is durable, and
the post-commit work in a ``TestCase`` needs the test's own blocks. Each function below
names what it relies on; ``tests/protocol/test_transactions.py`` pins the meaning of each
on every Django version of the matrix, so that a release that changes one fails there
first, not in a payment.

Relied on (``BaseDatabaseWrapper`` and ``django.db.transaction.Atomic``):

* ``atomic_blocks``: the open ``Atomic`` objects, outermost first;
* ``savepoint_ids``: the savepoint of ``atomic_blocks[i + 1]`` at ``i`` (``None`` for a
  block that made none); the outermost block opens a transaction, not a savepoint;
* ``Atomic._from_testcase``: set on the blocks ``TestCase`` opens around a test;
* ``needs_rollback``, ``closed_in_transaction``: the transaction will roll back;
* ``run_on_commit``: the ``on_commit`` callbacks waiting for the COMMIT, a list the
  connection runs and clears with ``run_and_clear_commit_hooks()``.
"""

from __future__ import annotations

from typing import Any


def starts_transaction(connection: Any) -> bool:
    """Whether an ``atomic()`` entered now is the outermost block, whose end COMMITs: not in
    a block, nor in a transaction managed by hand (``set_autocommit(False)``)."""
    return not connection.in_atomic_block and bool(connection.get_autocommit())


def will_commit(connection: Any) -> bool:
    """Whether the current transaction can still commit (no error marked it for rollback,
    the connection was not closed inside it)."""
    return not marked_for_rollback(connection) and not connection.closed_in_transaction


def marked_for_rollback(connection: Any) -> bool:
    """Whether an error marked the current transaction for rollback."""
    return bool(connection.needs_rollback)


def from_testcase(block: Any) -> bool:
    """Whether ``block`` (an ``Atomic``) is one of the blocks a ``TestCase`` opened."""
    return bool(getattr(block, "_from_testcase", False))


def innermost_testcase_block(connection: Any) -> Any | None:
    """The innermost of the blocks a ``TestCase`` opened that the current point is in (the
    test's own, inside its class's), or None outside a ``TestCase``."""
    for block in reversed(connection.atomic_blocks):
        if from_testcase(block):
            return block
    return None


def only_testcase_outside(connection: Any) -> bool:
    """Whether every block around the innermost one is a ``TestCase``'s (and there is at
    least one): the innermost block's end is where production would COMMIT."""
    outer = connection.atomic_blocks[:-1]
    return bool(outer) and all(from_testcase(block) for block in outer)


def only_testcase_blocks(connection: Any) -> bool:
    """Whether blocks are open and every one is a ``TestCase``'s."""
    blocks = connection.atomic_blocks
    return bool(blocks) and all(from_testcase(block) for block in blocks)


def innermost_block(connection: Any) -> Any | None:
    """The innermost open ``Atomic`` block, or None."""
    blocks = connection.atomic_blocks
    return blocks[-1] if blocks else None


def testcase_commit_point(connection: Any) -> str | None:
    """The savepoint of the outermost block of the project's inside a ``TestCase``'s blocks,
    when the current point is in one and that block has a savepoint; else None."""
    blocks = connection.atomic_blocks
    if not blocks or not from_testcase(blocks[0]):
        return None
    for index, block in enumerate(blocks):
        if not from_testcase(block):
            sid: str | None = connection.savepoint_ids[index - 1]
            return sid
    return None


def open_savepoints(connection: Any) -> set[str]:
    """The savepoints the current point is under (as ``on_commit`` records them)."""
    return {sid for sid in connection.savepoint_ids if sid is not None}


def take_commit_hooks(connection: Any) -> list[Any]:
    """Remove the ``on_commit`` callbacks waiting for the COMMIT and return them, so that
    the COMMIT runs none of them (see :func:`run_commit_hooks`)."""
    hooks: list[Any]
    hooks, connection.run_on_commit = connection.run_on_commit, []
    return hooks


def run_commit_hooks(connection: Any, hooks: list[Any]) -> None:
    """Run ``hooks`` (from :func:`take_commit_hooks`), then any registered since, in
    Django's order and way (a robust one's error logged, another's propagated)."""
    connection.run_on_commit = hooks + connection.run_on_commit
    connection.run_and_clear_commit_hooks()
