"""The reference node agent (``mediator agent``) end to end: a real agent process against a real
gunicorn on PostgreSQL."""
