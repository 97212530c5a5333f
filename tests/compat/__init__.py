"""Compatibility suite
(docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl): the original
fleet's node agent (enode) and submitter CLI (runctl) played against a real Mediator, request for
request as their Go code builds them, each answer decoded the way their Go types decode it."""
