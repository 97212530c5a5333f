"""``python -m app.commands``: the ``mediator`` command."""

from app.commands.main import main

main(prog_name="mediator")
