"""The request path, the same for every strategy: the key, the scope and the fingerprint of
a request, its claim, the view's run under a lease, and the answer (stored, replayed or a
problem). The adapters (``mixins``, ``decorators``, ``middleware``, ``drf``) call
:mod:`django_idempotency.protocol.engine`; the protocol calls a strategy."""
