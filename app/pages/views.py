"""Pages for people (docs/pages.md#pages-for-people): sign-in with a server-side session, the
overview at ``/``, runs, a run, asks with their answer forms, nodes with an operator's drain and
quarantine forms, teams; and the run's log, artifacts and Record as downloads.

A page calls the same service functions as the API, under the same table of access
(:data:`app.api.auth.ROUTES`): a page or a form is allowed exactly when the API route it stands
for is. The session's cookie holds only a random id; ``/v1`` never reads it. Every POST carries a
CSRF token (Flask-WTF) derived from the session; one without it is refused before anything else.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    g,
    redirect,
    render_template,
    request,
    session,
    stream_with_context,
    url_for,
)
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.wrappers import Response as BaseResponse

from app import states
from app.api.asks import ANSWER_RULE
from app.api.auth import ROUTES, caller_of, may_call, verified_token
from app.api.common import ctx, query_args
from app.api.observe import run_filters
from app.api.results import _seq
from app.api.schemas import LogReadQuerySchema
from app.context import Caller
from app.contract import is_valid_id
from app.errors import (
    BadRequest,
    Forbidden,
    MediatorError,
    NotFound,
    PayloadTooLarge,
    TooManyFailures,
    Unauthorized,
    Unprocessable,
)
from app.pages.askform import AskForm, Reading, field_of_violation, form_of, read_answer
from app.pages.timeline import timeline
from app.services.access import note_failed_authentication
from app.services.asks import answer, list_asks, open_ask_schema
from app.services.cancel import cancel_run
from app.services.observe import capabilities, nodes_list, run_page, runs_list
from app.services.operators import hold_node, lift_node, quarantine_node, resume_node
from app.services.records import get_blob, read_log, record_stream
from app.services.status import status
from app.services.teams import teams_view, usage_chart
from app.services.ui_sessions import (
    PageSession,
    csrf_seed,
    page_secret,
    session_of,
    sign_in,
    sign_out,
)
from app.states import NODE_KINDS, QUEUED, RUN_ALIVE
from app.teamchart import team_chart

F = TypeVar("F", bound=Callable[..., Any])

APP_DIR = Path(__file__).resolve().parent.parent
blp = Blueprint(
    "pages",
    __name__,
    template_folder=str(APP_DIR / "templates"),
    static_folder=str(APP_DIR / "static"),
    static_url_path="/static",
)
csrf = CSRFProtect()

COOKIE = "mediator_session"
CSRF_COOKIE = "mediator_csrf"  # Flask's signed cookie: the CSRF seed of a browser not signed in
REFRESH_SECONDS = 10  # the overview reloads itself (the status page, docs/pages.md#overview-)
# The pages' own policy: our script and sheet only, never framed (clickjacking), forms post here.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
# Our own URLs (run ids, ask ids) go to no other site, and our forms carry the Referer that
# Flask-WTF's CSRF check wants over HTTPS. deploy/nginx.conf sends the same (docs/security.md).
REFERRER_POLICY = "same-origin"
# What a node uploaded never runs as our page: downloads are sandboxed, not sniffed.
FILE_CSP = "sandbox"
NOT_PAGES = ("/v1/", "/healthz", "/readyz", "/metrics", "/static/")
CANCEL_RULE = "/v1/runs/<run_id>/cancel"
DRAIN_RULE = "/v1/nodes/<node_id>/drain"
QUARANTINE_RULE = "/v1/nodes/<node_id>/quarantine"
ASKS_RULE = "/v1/asks"
SHOWN_LOG_KINDS = NODE_KINDS


def is_page_path(path: str) -> bool:
    return not path.startswith(NOT_PAGES)


class PageCookieSession(SecureCookieSessionInterface):
    """Flask's signed cookie, for pages only, holding nothing but the CSRF seed; signed with the
    key in the database (every worker and host the same), read once per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def open_session(self, app: Flask, request: Any) -> Any:
        if not is_page_path(request.path):
            return None  # /v1 and the probes: no cookie is read or written
        if not app.secret_key:
            try:
                app.extensions["mediator.schema"].check()  # a schema without ui_secret
                with self._lock:
                    if not app.secret_key:
                        app.secret_key = page_secret(app.extensions["mediator"])
            except Exception:
                # No key yet: the page's own hook answers (503 for the schema or the database).
                return self.make_null_session(app)
        return super().open_session(app, request)


def init_pages(app: Flask) -> None:
    """The pages' blueprint, their cookie settings and the CSRF check (only on pages: the API's
    callers send bearer tokens, which a browser never sends on its own)."""
    secure = not app.extensions["mediator"].config["ui.insecure_cookie"]
    app.config.update(
        WTF_CSRF_CHECK_DEFAULT=False,  # checked in the pages' own hook, never on /v1
        WTF_CSRF_TIME_LIMIT=None,  # a seed lives as long as its session
        SESSION_COOKIE_NAME=CSRF_COOKIE,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=secure,
    )
    app.session_interface = PageCookieSession()
    # The run and step states as app/states.py names them: templates never spell one out.
    app.jinja_env.globals["states"] = states
    csrf.init_app(app)
    app.register_blueprint(blp)


# ---------------------------------------------------------------- every page request


def me() -> Caller | None:
    return g.get("page_caller")


def _caller_of(page: PageSession) -> Caller:
    """The session's caller, as the API would make it: the token's own principal, else the one
    given at sign-in, self-declared (docs/tokens.md#principal)."""
    token = page.token
    if token.principal is not None:
        return caller_of(token, token.principal, False)
    return caller_of(token, page.principal, True)


@blp.before_request
def _before() -> None:
    if request.endpoint == "pages.static":
        return
    current_app.extensions["mediator.schema"].check()
    page = session_of(ctx(), request.cookies.get(COOKIE))
    g.page_session = page
    g.page_caller = _caller_of(page) if page is not None else None
    if page is not None:
        seed = csrf_seed(str(current_app.secret_key), page)
        if session.get("csrf_token") != seed:
            session["csrf_token"] = seed
    if request.method == "POST":
        csrf.protect()  # refused (400) before any form field is read


@blp.after_request
def _headers(resp: Response) -> Response:
    resp.headers.setdefault("Content-Security-Policy", PAGE_CSP)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = REFERRER_POLICY
    if request.endpoint != "pages.static":
        resp.headers["Cache-Control"] = "no-store"
    stale = "page_session" in g and g.page_session is None and request.cookies.get(COOKIE)
    if g.get("page_session_ended") or stale:  # a session ended or unknown: forget its cookie
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="Lax")
    return resp


def _error_page(code: int, title: str, reason: str, headers: Any = None) -> tuple[str, int, Any]:
    html = render_template("error.html", code=code, title=title, reason=reason, me=me())
    return html, code, dict(headers or {})


@blp.errorhandler(MediatorError)
def _mediator_error(exc: MediatorError) -> tuple[str, int, Any]:
    titles = {400: "Bad request", 401: "Sign-in needed", 403: "Not allowed", 404: "Not found"}
    titles.update({409: "Conflict", 422: "Not accepted", 429: "Too many attempts"})
    return _error_page(exc.status, titles.get(exc.status, "Error"), exc.reason, exc.headers)


@blp.errorhandler(CSRFError)
def _csrf_error(exc: CSRFError) -> tuple[str, int, Any]:
    return _error_page(
        400,
        "Form refused",
        "the form's CSRF token is missing or is not this session's; nothing was changed. "
        "Open the page again and resend the form.",
    )


def signed_in(method: str, rule: str) -> Callable[[F], F]:
    """The page stands for the API route ``method rule``: a browser not signed in goes to the
    sign-in (a GET) or is refused (401), and a token outside the route's roles is refused (403),
    as on ``/v1``."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            who = me()
            if who is None:
                if request.method == "GET":
                    return redirect(url_for("pages.signin", next=_here()), 303)
                raise Unauthorized("sign in first")
            access = ROUTES[(method, rule)]
            if not access.allows(who):
                raise Forbidden(f"token {who.token_name} lacks the role: {access.needed}")
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def _here() -> str:
    return request.full_path.rstrip("?") if request.query_string else request.path


def _page(template: str, **values: Any) -> Response:
    return Response(render_template(template, me=me(), **values), mimetype="text/html")


def _known_run(run_id: str) -> str:
    """A run id no run can have is a 404, like one no run has (docs/api.md#conventions)."""
    if not is_valid_id(run_id):
        raise NotFound(f"no such run: {run_id}")
    return run_id


def _attachment(resp: Response, filename: str) -> Response:
    resp.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    resp.headers["Content-Security-Policy"] = FILE_CSP
    return resp


# ---------------------------------------------------------------- sign-in and out


# A path of this site: one slash, then no second slash or backslash (another host), no control.
_LOCAL_PATH = re.compile(r"\A/(?![/\\])[^\x00-\x1f\x7f]{0,2000}\Z")


def _safe_next(target: str | None) -> str:
    """Only a path of this site: never another host (an open redirect)."""
    if target and _LOCAL_PATH.match(target):
        return target
    return "/"


@blp.route("/signin", methods=["GET", "POST"])
def signin() -> Any:
    hours = ctx().config["ui.session_hours"]
    next_path = _safe_next(request.values.get("next"))
    if request.method == "GET":
        return _page("signin.html", next_path=next_path, hours=hours)
    secret = (request.form.get("token") or "").strip()
    principal = (request.form.get("principal") or "").strip() or None
    if principal is not None and (
        len(principal) > 200 or any(ord(c) < 32 or c == "\x7f" for c in principal)
    ):
        raise BadRequest("principal must be at most 200 characters, without control characters")
    context = ctx()
    address = request.remote_addr or "unknown"
    if context.failures.blocked(address):
        raise TooManyFailures(headers={"Retry-After": "60"})
    token = verified_token(secret) if secret else None
    if token is None:
        if note_failed_authentication(context, address):
            raise TooManyFailures(headers={"Retry-After": "60"})
        html = render_template(
            "signin.html",
            me=None,
            next_path=next_path,
            hours=hours,
            principal=principal,
            error="that is not a token of this Mediator (or it has expired)",
        )
        return html, 401
    if token.principal is not None and principal not in (None, token.principal):
        raise Forbidden(f"the principal differs from the principal of token {token.name}")
    session_id = sign_in(context, token, None if token.principal is not None else principal)
    resp = redirect(next_path, 303)
    resp.set_cookie(
        COOKIE,
        session_id,
        max_age=int(hours * 3600),
        path="/",
        httponly=True,
        samesite="Lax",
        secure=not context.config["ui.insecure_cookie"],
    )
    session.pop("csrf_token", None)  # the next page derives the seed from the new session
    return resp


@blp.route("/signout", methods=["POST"])
def signout() -> BaseResponse:
    sign_out(ctx(), request.cookies.get(COOKIE))
    g.page_session_ended = True
    session.pop("csrf_token", None)
    return redirect(url_for("pages.signin"), 303)


# ---------------------------------------------------------------- the overview


@blp.get("/")
def overview() -> Any:
    if ctx().config["ui.require_token"] and me() is None:
        return redirect(url_for("pages.signin", next="/"), 303)
    return _page("status.html", s=status(ctx()), refresh=REFRESH_SECONDS)


# ---------------------------------------------------------------- runs


@blp.get("/runs")
@signed_in("GET", "/v1/runs")
def runs() -> Response:
    filters = run_filters()
    listing = runs_list(ctx(), **filters)
    given = {
        k: request.args[k]
        for k in ("state", "since", "work", "team", "limit")
        if request.args.get(k)
    }
    next_url = None
    if "next" in listing:
        next_url = url_for("pages.runs") + "?" + urlencode({**given, "before": listing["next"]})
    return _page("runs.html", listing=listing, given=given, next_url=next_url)


@blp.get("/runs/<run_id>")
@signed_in("GET", "/v1/runs/<run_id>")
def run(run_id: str) -> Response:
    who = me()
    assert who is not None
    page = run_page(ctx(), _known_run(run_id), who)
    view = page["run"]
    # Every step a node runs has its log's place, filled live once the step starts.
    logs = [{"step": st} for st in view["steps"] if st["kind"] in SHOWN_LOG_KINDS]
    return _page(
        "run.html",
        run=view,
        events=page["events"],
        artifacts=page["artifacts"],
        logs=logs,
        picture=timeline(view["steps"], datetime.now(UTC)),
        queued=view["state"] == QUEUED,
        # Cancel for those who may (docs/pages.md#a-run-runsrun_id): the route's roles, then the
        # cancel's own rule.
        may_cancel=view["state"] in RUN_ALIVE
        and may_call(who, "POST", CANCEL_RULE)
        and page["may_cancel"],
        verdict_json=json.dumps(view.get("verdict"), indent=1) if view.get("verdict") else None,
    )


@blp.post("/runs/<run_id>/cancel")
@signed_in("POST", CANCEL_RULE)
def cancel(run_id: str) -> BaseResponse:
    who = me()
    assert who is not None
    cancel_run(ctx(), _known_run(run_id), who)
    return redirect(url_for("pages.run", run_id=run_id), 303)


@blp.get("/runs/<run_id>/steps/<seq>/log")
@signed_in("GET", "/v1/runs/<run_id>/steps/<seq>/log")
def log(run_id: str, seq: str) -> Response:
    n = _seq(seq)
    query = query_args(LogReadQuerySchema())
    name = query["name"]
    view = read_log(ctx(), _known_run(run_id), n, name, query["offset"])
    resp = Response(view.data, status=200, mimetype="text/plain")
    resp.headers["X-Enode-Log-Bytes"] = str(view.state.total)
    return _attachment(resp, f"{run_id}-{n}-{name}.log")


@blp.get("/runs/<run_id>/artifacts/<name>")
@signed_in("GET", "/v1/runs/<run_id>/blob/<name>")
def artifact(run_id: str, name: str) -> Response:
    data = get_blob(ctx(), _known_run(run_id), name)
    resp = Response(data, status=200, mimetype="application/octet-stream")
    return _attachment(resp, name if is_valid_id(name) else "artifact")


@blp.get("/runs/<run_id>/record")
@signed_in("GET", "/v1/runs/<run_id>/record")
def record(run_id: str) -> Response:
    chunks = record_stream(ctx(), _known_run(run_id))
    resp = Response(stream_with_context(chunks), status=200, mimetype="application/x-tar")
    return _attachment(resp, f"run-{run_id}.tar")


# ---------------------------------------------------------------- asks


def _asks_page(failed: dict[str, Any] | None = None, status_code: int = 200) -> Response:
    who = me()
    assert who is not None
    listed = list_asks(ctx(), who, may_answer=may_call(who, "POST", ANSWER_RULE))["asks"]
    # The asks this principal may answer first, then the others (docs/pages.md#asks-asks); oldest
    # first in each.
    listed.sort(key=lambda a: not a["can_answer"])
    for item in listed:
        item["form"] = form_of(item.get("schema"))
        item["key"] = f"{item['run_id']}/{item['seq']}"
        item["shown_text"] = [
            {**s, "text": _shown_text(s.get("content"))} for s in item.get("shown") or []
        ]
    resp = _page("asks.html", asks=listed, failed=failed or {})
    resp.status_code = status_code
    return resp


def _shown_text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, indent=1)


@blp.get("/asks")
@signed_in("GET", ASKS_RULE)
def asks() -> Response:
    return _asks_page()


@blp.post("/asks/<run_id>/<seq>")
@signed_in("POST", ANSWER_RULE)
def answer_ask(run_id: str, seq: str) -> Any:
    """The answer of a form, through the same service as ``POST …/answer``; a value the form
    cannot read or the schema refuses shows again with its reason beside the field."""
    who = me()
    assert who is not None
    n = _seq(seq)
    schema = open_ask_schema(ctx(), _known_run(run_id), n, who)
    form: AskForm = form_of(schema)
    reading: Reading = read_answer(form, request.form)
    key = f"{run_id}/{n}"
    if reading.errors:
        return _asks_page({"key": key, "errors": reading.errors, "typed": reading.typed}, 400)
    raw = json.dumps(reading.value).encode()
    if len(raw) > ctx().config["max_blob_bytes"]:
        # the answer route's bound (docs/api.md#post-v1runsrun_idstepsseqanswer--answer-an-ask)
        raise PayloadTooLarge()
    try:
        answer(ctx(), run_id, n, lambda: raw, who)
    except Unprocessable as exc:
        errors = {field_of_violation(form, exc.reason): exc.reason}
        return _asks_page({"key": key, "errors": errors, "typed": reading.typed}, 422)
    return redirect(url_for("pages.run", run_id=run_id, answered=n), 303)


# ---------------------------------------------------------------- nodes


def _tile(node: dict[str, Any]) -> str:
    if not node["live"]:
        return "notlive"
    # unavailable until lifted (docs/operators.md#quarantine)
    if node["health"]["state"] == "quarantined":
        return "quarantined"
    if node["draining"]:
        return "draining"
    return "leased" if node["lease"] else "free"


def _nodes_page(failed: dict[str, Any] | None = None, status_code: int = 200) -> Response:
    who = me()
    assert who is not None
    listing = nodes_list(ctx())
    for node in listing["nodes"]:
        node["tile"] = _tile(node)
    counts: dict[str, int] = {}
    for node in listing["nodes"]:
        counts[node["tile"]] = counts.get(node["tile"], 0) + 1
    resp = _page(
        "nodes.html",
        listing=listing,
        counts=counts,
        capabilities=capabilities(ctx())["capabilities"],
        # Each form for those whose roles allow its API route (no button that 403s:
        # docs/pages.md#signing-in).
        may=_node_actions(who),
        failed=failed or {},
        done=_done_notice(),
    )
    resp.status_code = status_code
    return resp


def _node_actions(who: Caller) -> dict[str, bool]:
    return {
        "drain": may_call(who, "POST", DRAIN_RULE),
        "resume": may_call(who, "DELETE", DRAIN_RULE),
        "quarantine": may_call(who, "POST", QUARANTINE_RULE),
        "lift": may_call(who, "DELETE", QUARANTINE_RULE),
    }


# What the nodes page says after a form was taken (``?done=<action>&node=<id>``).
NODE_NOTICES = {
    "drain": "is held: it takes no new run",
    "resume": "is no longer held",
    "quarantine": "is quarantined",
    "lift": "is out of quarantine, its strikes reset",
}


def _done_notice() -> dict[str, str] | None:
    action, node_id = request.args.get("done"), request.args.get("node")
    if action not in NODE_NOTICES or not node_id or not is_valid_id(node_id):
        return None
    return {"node": node_id, "text": NODE_NOTICES[action]}


def _known_node(node_id: str) -> str:
    """A node id no node can have is a 404, like one that never advertised."""
    if not is_valid_id(node_id):
        raise NotFound(f"no such node: {node_id}")
    return node_id


def _node_form(
    node_id: str, action: str, change: Callable[[str, Caller], Any], typed: dict[str, str]
) -> Any:
    """Do ``change`` (a service function of docs/operators.md, as the API route does) and go back
    to the nodes page with its notice; a reason or mode the service refuses shows the nodes page
    again with the reason beside that form and what was typed kept, and changes nothing."""
    who = me()
    assert who is not None
    node_id = _known_node(node_id)
    try:
        change(node_id, who)
    except BadRequest as exc:
        failed = {"node": node_id, "form": action, "error": exc.reason, "typed": typed}
        return _nodes_page(failed, 400)
    return redirect(url_for("pages.nodes", done=action, node=node_id) + f"#node-{node_id}", 303)


def _reason_field() -> str:
    # A reason of blanks alone is none: the service then says it is required.
    return (request.form.get("reason") or "").strip()


@blp.get("/nodes")
@signed_in("GET", "/v1/nodes")
def nodes() -> Response:
    return _nodes_page()


@blp.post("/nodes/<node_id>/drain")
@signed_in("POST", DRAIN_RULE)
def drain_node(node_id: str) -> Any:
    body = {"mode": request.form.get("mode") or "", "reason": _reason_field()}
    return _node_form(node_id, "drain", lambda n, who: hold_node(ctx(), n, body, who), dict(body))


@blp.post("/nodes/<node_id>/resume")
@signed_in("DELETE", DRAIN_RULE)
def resume(node_id: str) -> Any:
    return _node_form(node_id, "resume", lambda n, who: resume_node(ctx(), n, who), {})


@blp.post("/nodes/<node_id>/quarantine")
@signed_in("POST", QUARANTINE_RULE)
def quarantine(node_id: str) -> Any:
    body = {"reason": _reason_field()}
    return _node_form(
        node_id, "quarantine", lambda n, who: quarantine_node(ctx(), n, body, who), dict(body)
    )


@blp.post("/nodes/<node_id>/lift")
@signed_in("DELETE", QUARANTINE_RULE)
def lift(node_id: str) -> Any:
    return _node_form(node_id, "lift", lambda n, who: lift_node(ctx(), n, who), {})


# ---------------------------------------------------------------- teams


@blp.get("/teams")
@signed_in("GET", "/v1/teams")
def teams() -> Response:
    """The teams as ``GET /v1/teams`` lists them, and the last day's usage of
    ``GET /v1/teams/usage`` (the same roles: any token) as stacked bars drawn here."""
    listing = teams_view(ctx())
    chart = team_chart(usage_chart(ctx()), [t["name"] for t in listing["teams"]])
    return _page("teams.html", listing=listing, chart=chart)
