"""The ``mediator`` client commands: submit, watch and answer runs over the HTTP API.

``http`` talks to a Mediator (and turns every failure into an exit code and one line that names
what to fix), ``render`` turns its answers into tables and lines for people, ``watch`` follows a
run or a log as it changes, and ``commands`` holds the click commands that ``app.commands.main`` registers.
"""
