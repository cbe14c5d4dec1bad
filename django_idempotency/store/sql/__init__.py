"""The compiled SQL behind the managers: one builder per statement, one dialect per vendor.

The statements are private to the store: those of IdempotencyKey and of its outbox are
composed by the builders of the family modules (:mod:`.claim`, :mod:`.read`, :mod:`.owner`,
:mod:`.completed`, :mod:`.fence`, :mod:`.outbox`, :mod:`.purge`) from the models' columns,
in the SQL of the connection's dialect (:mod:`.postgresql`, :mod:`.sqlite`, :mod:`.mysql`),
and cached per connection by :func:`.statements.statements`. The layers above ask a
dialect's features (:func:`.statements.features_of`), never a vendor's name. What the
statements do is told in docs/how-it-works.md and docs/hybrid.md.

This package re-exports nothing: each name is imported from the module that defines it, so
that importing one module of the package never imports the others through this file.
"""
