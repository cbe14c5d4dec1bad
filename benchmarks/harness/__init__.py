"""What every measure shares, one concept a module.

* ``cli``: ``python -m benchmarks``, the shared options, ``Measure`` (what a measure exports);
* ``paths``: the checkout, and the environment of the processes a measure starts;
* ``rounds``: interleaved rounds; ``stats``: medians, ratios and their spread;
* ``report``: the conditions line and the result tables (``--json``);
* ``postgres``: scratch databases; ``redis``: private ``redis-server`` processes and clusters;
* ``processes``: free ports, stopping a process group; ``web``: gunicorn and HTTP requests;
* ``inprocess``: Django configured in the measuring process;
* ``control``: the control project's environment (benchmarks/control);
* ``example``: the example project's database, server and Celery worker.

Nothing here imports the tests: the benchmarks run from a checkout without them.
"""
