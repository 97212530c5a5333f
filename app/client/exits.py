"""The exit codes of the client commands: their numbers, and the one table of what each means
(``mediator help exit-codes`` prints it; docs/client.md shows the same table)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the run's verdict is FAILED
EXIT_USAGE = 2  # click's own code for a usage error; a client configuration that cannot be used
EXIT_UNREACHABLE = 3  # no answer, or the Mediator failed (5xx)
EXIT_TIMEOUT = 4  # --wait --timeout passed before the run finished (it goes on)
EXIT_CREDENTIALS = 5  # 401 or 403, or a token the client cannot read or send
EXIT_REFUSED = 6  # any other refusal: another 4xx, or input the client refuses itself
EXIT_INTERRUPTED = 130  # Ctrl-C while watching (128 + SIGINT, as shells report it); it goes on

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done; with --wait, the run SUCCEEDED"),
    (EXIT_FAILED, "with --wait: the run FAILED"),
    (
        EXIT_USAGE,
        "usage: a command, option or argument that is wrong (click's own usage errors), or a "
        "client configuration that cannot be used (the file, a profile not in it, a URL that is "
        "not http:// or https://)",
    ),
    (EXIT_UNREACHABLE, "the Mediator could not be reached, or failed (5xx)"),
    (EXIT_TIMEOUT, "--wait --timeout: the run had not finished in time; it goes on"),
    (
        EXIT_CREDENTIALS,
        "credentials refused: the Mediator answered 401 (no token, or one it does not know) or "
        "403 (the token's roles or the principal may not do this), or the client cannot read "
        "or send the token (its file, its characters)",
    ),
    (
        EXIT_REFUSED,
        "request refused: the Mediator answered another 4xx (its reason is printed) or a "
        "redirect, or the client refused the input itself, as the Mediator would (a contract, "
        "an answer, a file it cannot read or write)",
    ),
    (EXIT_INTERRUPTED, "Ctrl-C while watching a run or following a log; the run goes on"),
)
