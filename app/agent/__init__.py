"""``mediator agent``: the reference node agent, what a node owner installs on a machine of the
fleet (docs/api.md#node-agents).

It advertises the node's capabilities every ``renew_seconds`` (the heartbeat, with a fresh
instance id per start), long-polls for steps, runs ``run`` steps as subprocesses without a shell
(``agent`` steps through a harness command of its configuration) in a fresh working directory
with ``$IN`` and ``$OUT``, streams the log, uploads ``$OUT`` and reports the result until the
Mediator answers. A step whose lease leaves the heartbeat reply is stopped; SIGTERM drains.

``config`` reads the node's advert and the agent's settings, ``link`` talks HTTP to the
Mediator, ``leases`` keeps what the last heartbeat said, ``step`` runs one step, ``loop`` is the
agent itself and ``command`` its click command.
"""
