"""Drivers of the Mediator's callers for tests (tests/README.md): what an actor does, not how its
requests are built."""
