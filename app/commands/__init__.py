"""The ``mediator`` command (docs/client.md): ``main`` and its groups, one module each."""
