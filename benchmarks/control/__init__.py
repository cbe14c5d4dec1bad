"""An ordinary DRF project, the control the benchmarks measure the library against.

Nothing here is tuned for the library: ``startproject``'s middleware, token
authentication, a ``ListCreateAPIView`` with a ``ModelSerializer`` that writes one
row. ``/plain/orders/`` is that view; ``/<strategy>/orders/`` is the same view with
``IdempotencyMixin`` first in its bases and ``idempotency_strategy`` set, so one
server serves every route with the same settings. See docs/benchmarks.md.
"""
