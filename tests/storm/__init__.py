"""The storm: several processes submitting, cancelling, advertising (drains, restarts, capability
changes, silences), claiming and reporting at once against a real gunicorn with 4 workers and two
reapers, with the invariant checker of tests/support/invariants.py sampled throughout and run in
full at the end.

- ``driver.py``: one process of the storm (a submitter, the canceller, node agents, a reaper).
- ``tests/support/storm.py``: starts the server and the drivers, samples, collects, checks.
- ``test_storm.py``: the bounded storm CI runs (a fixed number of operations; its seed printed,
  ``STORM_SEED=<n>`` replays it).

A soak, outside CI, on a database of its own (the local PostgreSQL, ``MEDIATOR_TEST_DATABASE_URL``,
or a throwaway embedded one)::

    .venv/bin/python -m tests.storm --soak 600 [--seed N]

It prints the figures and exits 1 if anything was found. ``STORM_SOAK_SECONDS=600
./scripts/test tests/storm`` runs the test itself for that long.
"""
