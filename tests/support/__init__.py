"""Every helper the tests share, one module a subject (tests/README.md, "Where helpers live"): the
Mediator's callers driven as actors (what an actor does, not how its requests are built), apps and
servers, contracts, rows, Records, time and concurrency. tests/docs/test_test_layout.py keeps it
so."""
