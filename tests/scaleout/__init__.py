"""Several Mediator hosts on one PostgreSQL and one bucket: a run that moves between them, and the
storm across them."""
