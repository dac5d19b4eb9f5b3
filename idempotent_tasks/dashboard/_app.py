"""The dashboard's ASGI app: pages, the login form, and the two audited actions.

Routes (relative to wherever the app is mounted):

=======================================================  =====================================
``GET  /``                                               counts per operation and status, the
                                                         stuck records, a page of records
                                                         (``?status=&operation=&tenant=``)
``GET  /records/{tenant}/{operation}/{key}``             one record (``?show=response`` adds
                                                         its stored result)
``POST /records/{tenant}/{operation}/{key}/unpoison``    ``handler.unpoison(...)``
``POST /records/{tenant}/{operation}/{key}/resolve``     ``handler.resolve(...)`` (form field
                                                         ``outcome`` = done / retry / fail)
``GET|POST /login``                                      sign in with the operator token
=======================================================  =====================================

The parts of a record's path are percent-encoded, so tenants, operations and keys may hold any
character, ``/`` included.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .._core.errors import IdempotencyError, InvalidInputError, RecordNotFoundError
from .._core.handler import IdempotencyHandler
from .._core.records import Status
from . import _data
from ._security import (
    CSRF_FIELD,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    Session,
    Sessions,
    bearer_token,
    configured_token,
    mount_path,
    same_secret,
    set_session_cookie,
)

Scope3 = tuple[str, str, str]
ACTIONS = ("unpoison", "resolve")
RESOLVE_OUTCOMES = ("done", "retry", "fail")


def _status_of(err: IdempotencyError, default: int) -> int:
    """The page's status for a library error: 404 no such record, 400 bad input."""
    if isinstance(err, RecordNotFoundError):
        return 404
    return 400 if isinstance(err, InvalidInputError) else default


class _Refusal(Exception):
    """An answer other than the page: a status code and the line the page shows."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Dashboard:
    """The app's state: the handler, the operator token, sessions and the action log."""

    def __init__(self, handler: IdempotencyHandler, token: str | None) -> None:
        self.handler = handler
        self.token = token
        self.sessions = Sessions()
        self.actions = _data.ActionLog()
        self.templates = Environment(
            loader=PackageLoader("idempotent_tasks.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )

    # ------------------------------------------------------------------ rendering
    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """Render a template with what every page needs, and keep the visitor's session."""
        session, fresh = self._session(request)
        html = self.templates.get_template(name).render(
            base=mount_path(request), csrf_field=CSRF_FIELD, csrf=session.csrf,
            signed_in=session.signed_in, read_only=self.token is None, **context,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if fresh:
            set_session_cookie(response, request, session)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="idempotent-tasks dashboard"'
        return response

    def refused(self, request: Request, refusal: _Refusal) -> Response:
        return self.page(request, "message.html", refusal.status, title="Refused",
                         message=refusal.message)

    def _session(self, request: Request) -> tuple[Session, bool]:
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is not None:
            return session, False
        return self.sessions.new(), True

    # ------------------------------------------------------------------ pages
    async def index(self, request: Request) -> Response:
        try:
            filters, offset = _filters(request)
        except _Refusal as refusal:
            return self.refused(request, refusal)
        wanted = filters.get("status")
        listed = await _data.call(
            self.handler, "list_records", status=Status(wanted) if wanted else None,
            operation=filters.get("operation"), tenant=filters.get("tenant"),
            limit=_data.PAGE_SIZE + 1, offset=offset,
        )
        counts = _data.Counts.of(await _data.call(self.handler, "record_counts"))
        stuck = await _data.call(self.handler, "find_stuck_records", limit=_data.PAGE_SIZE)
        uncertain = await _data.call(self.handler, "list_records", status=Status.UNCERTAIN,
                                     limit=_data.PAGE_SIZE)
        now = self.handler.clock()
        more = len(listed) > _data.PAGE_SIZE
        return self.page(
            request, "index.html", title="Records", filters=filters, counts=counts,
            records=[_data.row(r, now) for r in listed[: _data.PAGE_SIZE]],
            stuck=[_data.row(r, now) for r in stuck], statuses=_data.statuses(),
            uncertain=[_data.row(r, now) for r in uncertain],
            uncertain_more=len(uncertain) >= _data.PAGE_SIZE,
            offset=offset, previous=_page_query(filters, max(offset - _data.PAGE_SIZE, 0)),
            next=_page_query(filters, offset + _data.PAGE_SIZE) if more else None,
        )

    async def records(self, request: Request) -> Response:
        try:
            scope, action = _record_route(request)
            if request.method == "POST":
                if action is None:
                    raise _Refusal(405, "POST to …/unpoison or …/resolve")
                return await self.act(request, scope, action)
            if action is not None:
                raise _Refusal(405, f"{action} is a POST, behind the record page's confirmation")
            return await self.record(request, scope)
        except _Refusal as refusal:
            return self.refused(request, refusal)

    async def record(self, request: Request, scope: Scope3) -> Response:
        tenant, operation, key = scope
        try:
            record = await _data.call(self.handler, "get_record", operation=operation,
                                      tenant=tenant, key=key)
            count = 0 if record is not None else await _data.call(
                self.handler, "retry_count", operation=operation, tenant=tenant, key=key)
            attempts = await _data.past_attempts(self.handler, scope)
        except IdempotencyError as err:
            raise _Refusal(_status_of(err, 503), str(err.message)) from err
        query = request.query_params
        done = query.get("done")
        shown = None if record is None else _data.detail(
            record, self.handler.clock(), show_response=query.get("show") == "response")
        return self.page(
            request, "record.html", 404 if record is None and not done else 200,
            title=f"{tenant} / {operation} / {key}", scope=scope, record=shown,
            retry_count=count, path=_data.record_path(scope), confirm=query.get("confirm"),
            done=done, actions=self.actions.of(scope), outcomes=RESOLVE_OUTCOMES,
            audit=await _data.audit_entries(self.handler, scope), attempts=attempts,
            can_resolve=callable(getattr(self.handler, "resolve", None)),
        )

    # ------------------------------------------------------------------ actions
    async def act(self, request: Request, scope: Scope3, action: str) -> Response:
        """Check the credential and the CSRF token, then run the action and show its page."""
        form = await self.authorize(request)
        actor = f"dashboard:{request.client.host if request.client else 'unknown'}"
        if action == "unpoison":
            detail = await self.unpoison(scope, actor)
        else:
            detail = await self.resolve(scope, actor, form)
        self.actions.add(scope, _data.Action(_data.when(self.handler.clock()), actor, action,
                                             detail))
        target = f"{mount_path(request)}{_data.record_path(scope)}?{urlencode({'done': action})}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    async def authorize(self, request: Request) -> FormData:
        """The form of an authorized POST: 403 read-only, 401 no/wrong token, 403 CSRF."""
        if self.token is None:
            raise _Refusal(403, "read-only: no operator token is configured "
                                "(IDEMPOTENT_TASKS_DASHBOARD_TOKEN or create_app(token=...))")
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        bearer = bearer_token(request)
        if bearer is not None:
            authorized = same_secret(bearer, self.token)
        else:
            authorized = session is not None and session.signed_in
        if not authorized:
            raise _Refusal(401, "sign in with the operator token, or send "
                                "Authorization: Bearer <token>")
        form = await request.form()
        given = form.get(CSRF_FIELD)
        if session is None or not same_secret(given if isinstance(given, str) else None,
                                              session.csrf):
            raise _Refusal(403, "missing or wrong CSRF token: submit the form of the "
                                "dashboard's own page")
        return form

    async def unpoison(self, scope: Scope3, actor: str) -> str:
        tenant, operation, key = scope
        try:
            old = await _data.call(self.handler, "unpoison", operation=operation,
                                   tenant=tenant, key=key, actor=actor)
        except IdempotencyError as err:
            raise _Refusal(_status_of(err, 503), str(err.message)) from err
        return f"deleted the FAILED record (retry counter was {old.retry_count})"

    async def resolve(self, scope: Scope3, actor: str, form: FormData) -> str:
        if not callable(getattr(self.handler, "resolve", None)):
            raise _Refusal(501, "this version of IdempotencyHandler has no resolve(): "
                                "UNCERTAIN records cannot be settled from the dashboard")
        outcome = form.get("outcome")
        if outcome not in RESOLVE_OUTCOMES:
            raise _Refusal(400, "outcome must be one of: " + ", ".join(RESOLVE_OUTCOMES))
        choice: dict[str, Any] = {"retry": True} if outcome == "retry" else {"fail": True}
        if outcome == "done":
            choice = {"done": _json_field(form.get("result"))}
        tenant, operation, key = scope
        try:
            await _data.call(self.handler, "resolve", operation=operation, tenant=tenant,
                             key=key, by=actor, **choice)
        except IdempotencyError as err:
            raise _Refusal(_status_of(err, 409), str(err.message)) from err
        return f"resolved as {outcome}"

    # ------------------------------------------------------------------ login
    async def login(self, request: Request) -> Response:
        target = _safe_next(request.query_params.get("next"))
        if request.method == "GET":
            return self.page(request, "login.html", title="Sign in", next=target, error=None)
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        form = await request.form()
        given_csrf, given_token = form.get(CSRF_FIELD), form.get("token")
        if self.token is None:
            return self.refused(request, _Refusal(403, "read-only: no operator token is set"))
        if session is None or not same_secret(_text(given_csrf), session.csrf):
            return self.refused(request, _Refusal(403, "missing or wrong CSRF token"))
        if not same_secret(_text(given_token), self.token):
            return self.page(request, "login.html", 401, title="Sign in", next=target,
                             error="That is not the operator token.")
        signed_in = self.sessions.sign_in(session)
        response = RedirectResponse(f"{mount_path(request)}{target}", status_code=303,
                                    headers=SECURITY_HEADERS)
        set_session_cookie(response, request, signed_in)
        return response


def create_app(handler: IdempotencyHandler, *, token: str | None = None) -> Starlette:
    """The operator dashboard as an ASGI app, to serve or to mount in an existing app.

    Args:
        handler: The handler whose store the dashboard shows; every read and action goes
            through its public operator calls, so its options (``on_stuck``, the clock) apply.
        token: The operator token that allows actions. ``None`` reads
            ``IDEMPOTENT_TASKS_DASHBOARD_TOKEN``; when neither is set the dashboard is
            read-only and every action answers 403.

    Returns:
        A Starlette application, e.g. for ``uvicorn.run(app)`` or
        ``Mount("/ops/idempotency", app=create_app(handler))``.
    """
    dashboard = Dashboard(handler, configured_token(token))
    routes = [
        Route("/", dashboard.index, methods=["GET"], name="index"),
        Route("/login", dashboard.login, methods=["GET", "POST"], name="login"),
        Route("/records/{rest:path}", dashboard.records, methods=["GET", "POST"],
              name="records"),
    ]
    app = Starlette(routes=routes)
    app.state.dashboard = dashboard
    return app


# ---------------------------------------------------------------------- request parsing
def _filters(request: Request) -> tuple[dict[str, str], int]:
    query = request.query_params
    filters = {name: query[name] for name in ("status", "operation", "tenant") if query.get(name)}
    if filters.get("status", "") not in ("", *_data.statuses()):
        raise _Refusal(400, "status must be one of: " + ", ".join(_data.statuses()))
    offset = query.get("offset", "0")
    if not offset.isdigit():
        raise _Refusal(400, "offset must be a whole number")
    return filters, int(offset)


def _page_query(filters: dict[str, str], offset: int) -> str:
    return "?" + urlencode({**filters, "offset": offset})


def _record_route(request: Request) -> tuple[Scope3, str | None]:
    """(tenant, operation, key) and the action from the still-encoded path, so that an
    encoded ``/`` inside a part stays inside it."""
    raw = request.scope.get("raw_path")
    # (some servers' and test clients' raw path carries the query string too)
    path = raw.decode("latin-1").partition("?")[0] if isinstance(raw, bytes) else ""
    prefix = mount_path(request) + "/records/"
    if not path.startswith(prefix):
        path = request.url.path  # a server that sent no raw path for this mount
    parts = [unquote(part) for part in path[len(prefix):].split("/")]
    action = parts.pop() if len(parts) == 4 and parts[-1] in ACTIONS else None
    if len(parts) != 3 or not all(parts):
        raise _Refusal(404, "a record's page is /records/TENANT/OPERATION/KEY, each part "
                            "percent-encoded")
    return (parts[0], parts[1], parts[2]), action


def _json_field(value: Any) -> Any:
    try:
        return json.loads(value) if isinstance(value, str) and value.strip() else None
    except ValueError as exc:
        raise _Refusal(400, f"result is not JSON: {exc}") from exc


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _safe_next(target: str | None) -> str:
    """A path inside the dashboard to go back to after signing in (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


__all__ = ["Dashboard", "create_app"]
