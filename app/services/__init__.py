"""The service layer: every transaction that changes state, and the work left after its commit."""
