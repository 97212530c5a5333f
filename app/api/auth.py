"""Who may call what: the bearer token of every ``/v1`` request, checked against the route's
roles and the token's nodes before anything else is looked at.

``ROUTES`` is the one table of access: each ``/v1`` route, the roles that may call it (``operator``
may call everything) and, for the routes a node agent calls, where the node it acts for is found.
A route missing from the table is refused to every token. ``/healthz``, ``/readyz``, the OpenAPI
document, ``/metrics`` and the status page are open by default; the last two call
:func:`check_token_when` (or wear :func:`require_token_when`) to ask for a token when configured.
A request to a route that checks no token is still authenticated when it carries an
``Authorization`` header (:func:`note_unchecked_authorization`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flask import g, request

from app.api.common import ctx, header_text, json_body
from app.context import Caller
from app.contract import is_valid_id
from app.errors import Forbidden, TooManyFailures, Unauthorized, Unavailable
from app.services.access import node_of_step, note_failed_authentication
from app.tokens import SlowVerificationBusy, Token, digest

F = TypeVar("F", bound=Callable[..., Any])

PRINCIPAL_HEADER = "X-Enode-Principal"
OPENAPI_PATH = "/v1/openapi.json"

# Where a node token's node is: the URL's node_id, the advert's node_id, or the step's node.
URL_NODE, ADVERT_NODE, STEP_NODE = "url", "advert", "step"


@dataclass(frozen=True)
class Access:
    """Who may call a route. ``roles`` empty: every valid token (the observation GETs)."""

    roles: frozenset[str] = frozenset()
    node: str | None = None  # URL_NODE, ADVERT_NODE or STEP_NODE for the node agents' routes

    def allows(self, token: Token | Caller) -> bool:
        return not self.roles or bool(token.roles & (self.roles | {"operator"}))

    @property
    def needed(self) -> str:
        return " or ".join([*sorted(self.roles - {"operator"}), "operator"])


ANY_TOKEN = Access()
NODE = frozenset({"node"})
SUBMITTER = frozenset({"submitter"})
ANSWERER = frozenset({"answerer"})
OPERATOR = frozenset({"operator"})

ROUTES: dict[tuple[str, str], Access] = {
    ("POST", "/v1/nodes"): Access(NODE, ADVERT_NODE),
    ("POST", "/v1/nodes/<node_id>/claim"): Access(NODE, URL_NODE),
    ("POST", "/v1/runs/<run_id>/steps/<seq>/result"): Access(NODE, STEP_NODE),
    ("POST", "/v1/runs"): Access(SUBMITTER),
    ("POST", "/v1/runs/dry-run"): Access(SUBMITTER),
    ("GET", "/v1/runs/<run_id>"): ANY_TOKEN,
    ("GET", "/v1/runs/dry-run"): ANY_TOKEN,  # the run view of a run named dry-run
    ("GET", "/v1/runs"): ANY_TOKEN,
    ("GET", "/v1/nodes"): ANY_TOKEN,
    # docs/operators.md: an operator's hold and quarantine, operators alone.
    ("POST", "/v1/nodes/<node_id>/drain"): Access(OPERATOR),
    ("DELETE", "/v1/nodes/<node_id>/drain"): Access(OPERATOR),
    ("POST", "/v1/nodes/<node_id>/quarantine"): Access(OPERATOR),
    ("DELETE", "/v1/nodes/<node_id>/quarantine"): Access(OPERATOR),
    ("GET", "/v1/capabilities"): ANY_TOKEN,
    ("GET", "/v1/teams"): ANY_TOKEN,  # docs/teams.md
    ("GET", "/v1/teams/usage"): ANY_TOKEN,  # docs/teams.md
    ("GET", "/v1/asks"): Access(ANSWERER | {"reader"}),
    ("POST", "/v1/runs/<run_id>/steps/<seq>/answer"): Access(ANSWERER),
    # A submitter cancels only the runs it submitted: the service checks that under the run's lock.
    ("POST", "/v1/runs/<run_id>/cancel"): Access(SUBMITTER),
    ("PUT", "/v1/runs/<run_id>/steps/<seq>/log"): Access(NODE, STEP_NODE),
    ("PUT", "/v1/runs/<run_id>/steps/<seq>/blob/<name>"): Access(NODE, STEP_NODE),
    ("GET", "/v1/runs/<run_id>/blob/<name>"): ANY_TOKEN,
    ("GET", "/v1/runs/<run_id>/steps/<seq>/log"): ANY_TOKEN,
    ("GET", "/v1/runs/<run_id>/ledger"): ANY_TOKEN,
    ("GET", "/v1/runs/<run_id>/record"): ANY_TOKEN,
    ("GET", "/v1/runs/<run_id>/events"): ANY_TOKEN,
}


def may_call(caller: Caller, method: str, rule: str) -> bool:
    """Whether the caller's roles allow that route (e.g. the asks inbox's ``can_answer``)."""
    access = ROUTES.get((method, rule))
    return access is not None and access.allows(caller)


def bearer_token() -> Token:
    """The token of ``Authorization: Bearer <secret>``; 401 for none or an unknown one, 429 once
    the client's address has failed too often this minute (a secret this process has already
    verified still passes: agents behind one NAT are not shut out by another's mistake), 503
    when no slot for a slow verification came free in time. The secret is never logged nor
    echoed. Decided once a request: asked again, it answers the same without counting again."""
    if "bearer_token" in g:
        known: Token | None = g.bearer_token
        if known is None:
            raise Unauthorized()
        return known
    token = _authenticated()
    g.bearer_token = token
    return token


def _authenticated() -> Token:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    context = ctx()
    address = request.remote_addr or "unknown"
    if context.failures.blocked(address) and not (
        secret and context.tokens.is_verified(digest(secret))
    ):
        context.tokens.count("rate_limited")
        raise TooManyFailures(headers={"Retry-After": "60"})
    token = None
    if scheme.lower() == "bearer" and secret:
        token = verified_token(secret)
    if token is None:
        if note_failed_authentication(context, address):
            context.tokens.count("rate_limited")
            raise TooManyFailures(headers={"Retry-After": "60"})
        g.bearer_token = None  # counted once: a later check of this request answers 401 alone
        raise Unauthorized()
    return token


def verified_token(secret: str) -> Token | None:
    """The configured token whose secret ``secret`` is, or None; 503 when no slot for a slow
    verification came free in time (docs/security.md#tokens-and-authentication). For every route
    that checks a token."""
    try:
        return ctx().tokens.verify(secret)
    except SlowVerificationBusy:
        raise Unavailable(
            "too many token verifications at once; try again", headers={"Retry-After": "1"}
        ) from None


def is_protected() -> bool:
    """Every ``/v1`` route but the OpenAPI document asks for a token."""
    rule = request.url_rule
    return rule is not None and rule.rule.startswith("/v1/") and rule.rule != OPENAPI_PATH


def authorise_request() -> None:
    """The app's hook before every request: a ``/v1`` request gets its :class:`Caller` in
    ``g.caller``, or a 401 (no or unknown token) or 403 (outside its roles, its nodes or its
    principal) before its body, its ids or the database are looked at for anything else."""
    if not is_protected():
        note_unchecked_authorization()
        return
    token = bearer_token()
    assert request.url_rule is not None
    if request.method == "OPTIONS":  # Flask's own answer naming the allowed methods
        access: Access | None = ANY_TOKEN
    else:
        method = "GET" if request.method == "HEAD" else request.method
        access = ROUTES.get((method, request.url_rule.rule))
    if access is None:
        raise Forbidden(f"no token may call {request.method} {request.url_rule.rule}")
    if not access.allows(token):
        raise Forbidden(f"token {token.name} lacks the role: {access.needed}")
    principal, declared = principal_of(token)
    if token.nodes is not None and access.node is not None:
        check_nodes(token, access.node)
    if declared:
        principal = header_text(PRINCIPAL_HEADER)
    g.caller = caller_of(token, principal, declared)


def note_unchecked_authorization() -> None:
    """A request to a route that checks no token (``/healthz``, ``/readyz``, the OpenAPI document,
    ``/metrics`` and the pages unless configured to, a path that is no route) is authenticated all
    the same when it carries an ``Authorization`` header: the sample nginx limits by address only
    the requests without one, leaving those with one to the limit on failed authentications, so a
    header that nobody verified would step around both (docs/security.md). A bad one counts as a
    failed authentication, and from an address over its limit the request is answered 429; else it
    is served as if it had no header."""
    if not request.headers.get("Authorization"):
        return
    try:
        bearer_token()
    except Unauthorized:
        pass  # counted; the route itself asks for no token


def caller_of(token: Token, principal: str | None, declared: bool) -> Caller:
    return Caller(
        token_name=token.name,
        roles=token.roles,
        principal=principal,
        nodes=token.nodes,
        max_priority=token.max_priority,
        principal_declared=declared,
        vouches=token.vouches_for_principals,
        team=token.team,
        teams=token.teams,
    )


def principal_of(token: Token) -> tuple[str | None, bool]:
    """The token's own principal (a different ``X-Enode-Principal`` is 403), or, for a token
    without one, ``(None, True)``: the header is then taken as given (self-declared)."""
    if token.principal is None:
        return None, True
    asserted = request.headers.get(PRINCIPAL_HEADER) or None
    if asserted is not None and asserted != token.principal:
        raise Forbidden(f"{PRINCIPAL_HEADER} differs from the principal of token {token.name}")
    return token.principal, False


def check_nodes(token: Token, where: str) -> None:
    """A token bound to nodes acts only for them: the node of the URL, of the advert, or of the
    step (bound in the database) and the result's ``node``. A step the token cannot see bound to
    one of its nodes — none at that seq, or still unplaced — is refused the same way."""
    assert token.nodes is not None
    args = request.view_args or {}
    if where == URL_NODE:
        _for_node(token, args.get("node_id"))
    elif where == ADVERT_NODE:
        body = json_body(nul_allowed=True)  # the advert's own parse, kept for its schema
        node = body.get("node_id") if isinstance(body, dict) else None
        if isinstance(node, str):
            _for_node(token, node)  # else the schema answers 400: nothing stored either way
    else:
        seq = _seq_or_none(args.get("seq", ""))
        run_id = args.get("run_id", "")
        found, node = (
            node_of_step(ctx(), run_id, seq) if seq and is_valid_id(run_id) else (False, None)
        )
        if not found or node is None:
            raise Forbidden(f"token {token.name} may act only on steps bound to its nodes")
        _for_node(token, node)
        if request.method == "POST":  # a result names the node that reports it
            body = json_body(nul_allowed=True)
            reporter = body.get("node") if isinstance(body, dict) else None
            if isinstance(reporter, str):
                _for_node(token, reporter)


def _for_node(token: Token, node: str | None) -> None:
    assert token.nodes is not None
    if node not in token.nodes:
        shown = node if node is not None and is_valid_id(node) else "that node"
        raise Forbidden(f"token {token.name} may not act for node {shown}")


def _seq_or_none(text: str) -> int | None:
    if text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0:
        return int(text)
    return None


# ------------------------------------------------------------------ routes outside /v1


def check_token_when(key: str) -> Caller | None:
    """For ``/metrics`` and the status page: when the boolean configuration key ``key``
    (``metrics.require_token``, ``ui.require_token``) is true, any valid token is needed (401
    otherwise) and its :class:`Caller` is returned; when false, None and nothing is checked."""
    if not ctx().config[key]:
        return None
    token = bearer_token()
    principal, declared = principal_of(token)
    if declared:
        principal = header_text(PRINCIPAL_HEADER)
    caller = caller_of(token, principal, declared)
    g.caller = caller
    return caller


def require_token_when(key: str) -> Callable[[F], F]:
    """The decorator form of :func:`check_token_when`: ``@require_token_when("ui.require_token")``
    on a view."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            check_token_when(key)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco
