"""Signals sent by the engine and the completer. The engine's are sent with ``sender`` = the
strategy class and keyword arguments ``request``, ``scope``, ``key`` and ``strategy`` (its
name); the completer's are described at the end."""

from django.dispatch import Signal

#: A request claimed a new key and is about to run the view.
key_claimed = Signal()
#: A request claimed a key left behind by a crashed owner or expired.
key_taken_over = Signal()
#: A completed key's stored response was replayed.
response_replayed = Signal()
#: A request found its key in progress and got a 409.
request_conflict = Signal()
#: A request reused a key with a different fingerprint and got a 422.
key_mismatch = Signal()
#: A claimed key was released (an exception in the view, or a 5xx that is not stored).
key_released = Signal()
#: A response was stored under its key.
response_stored = Signal()
#: The claim was lost before completion and the view's writes were rolled back.
lease_lost = Signal()
#: A duplicate found its key in progress and started waiting (``WAIT``).
wait_started = Signal()
#: A waiting duplicate was answered with the stored response.
wait_replayed = Signal()
#: A waiting duplicate's wait ran out (it gets the 409).
wait_timed_out = Signal()
#: A claim got its outcome (waits included): sent with ``outcome`` (``claimed``,
#: ``taken_over``, ``in_progress``, ``replay``, ``mismatch``, or ``error`` when the claim
#: raised) and ``seconds``; only timed while a receiver is connected (metrics connect one).
claim_timed = Signal()

# -- the completer (docs/steps.md, "The completer"): sent with ``sender`` = IdempotencyKey --
#: The completer ran a key's request (or found it taken first): sent with ``scope``, ``key``,
#: ``outcome`` (``completed``, ``failed``, ``dead_lettered`` or ``taken``), ``attempts`` (the
#: completer's runs of the key, this one included) and ``status`` (the response's, or None).
completer_ran = Signal()
#: The completer gave a key up (no attempts left, or a request it cannot send again): sent
#: with ``scope``, ``key``, ``attempts`` and ``reason``. Its client's retry still resumes it.
request_dead_lettered = Signal()
