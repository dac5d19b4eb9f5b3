"""Who may act, and proof that a form came from the dashboard's own page.

* **The operator token** (``create_app(token=…)`` or ``IDEMPOTENT_TASKS_DASHBOARD_TOKEN``) is
  the only credential.  A request proves it with ``Authorization: Bearer <token>`` or with a
  session that the login page marked as signed in after the token was typed into it.  Without
  a configured token nothing can sign in: the dashboard is read-only.
* **Sessions** live in the process that serves the dashboard (a random id in an HttpOnly,
  ``SameSite=Strict`` cookie), so a restart signs everyone out.  Every visitor gets one, because
  the CSRF token of the login form belongs to it; signing in issues a new id.
* **CSRF**: each session has a random token, written into every form as a hidden field and
  checked on every POST, whatever the credential.  Comparisons use ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

#: The environment variable ``create_app`` reads the operator token from when none is given.
TOKEN_ENV = "IDEMPOTENT_TASKS_DASHBOARD_TOKEN"
#: The session cookie's name.
SESSION_COOKIE = "idempotent_tasks_dashboard"
#: The hidden form field that carries the session's CSRF token.
CSRF_FIELD = "csrf_token"
#: Seconds a session is kept after its last use.
SESSION_IDLE_SECONDS = 8 * 3600.0
#: Sessions kept at most (the oldest are forgotten first).
MAX_SESSIONS = 10_000

#: Sent with every page: no scripts at all, styles only from the page itself, forms only to
#: the dashboard, never inside a frame.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def configured_token(token: str | None) -> str | None:
    """The operator token: the argument, else the environment; an empty one counts as none."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    return value or None


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a secret the client sent with the one we hold."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass
class Session:
    """One browser's session: its CSRF token, whether it signed in, when it was last used."""

    id: str
    csrf: str
    signed_in: bool
    last_used: float


class Sessions:
    """The process's sessions, bounded in number and idle time (thread-safe)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (and mark it used), or ``None``."""
        if not session_id:
            return None
        now = self._clock()
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            if now - session.last_used > SESSION_IDLE_SECONDS:
                del self._by_id[session_id]
                return None
            session.last_used = now
            self._by_id.move_to_end(session_id)
            return session

    def new(self, *, signed_in: bool = False) -> Session:
        """A fresh session with its own id and CSRF token."""
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), signed_in,
                          self._clock())
        with self._lock:
            self._by_id[session.id] = session
            while len(self._by_id) > MAX_SESSIONS:
                self._by_id.popitem(last=False)
        return session

    def sign_in(self, old: Session) -> Session:
        """Replace ``old`` by a signed-in session with a new id (no session fixation)."""
        with self._lock:
            self._by_id.pop(old.id, None)
        return self.new(signed_in=True)


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, if there is one."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def set_session_cookie(response: Response, request: Request, session: Session) -> None:
    """Send the session's cookie, scoped to the dashboard's mount path."""
    response.set_cookie(
        SESSION_COOKIE, session.id, httponly=True, samesite="strict",
        secure=request.url.scheme == "https", path=mount_path(request) or "/",
        max_age=int(SESSION_IDLE_SECONDS),
    )


def mount_path(request: Request) -> str:
    """Where the dashboard is mounted ("" at the root of its server)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


__all__ = [
    "CSRF_FIELD",
    "SECURITY_HEADERS",
    "SESSION_COOKIE",
    "TOKEN_ENV",
    "Session",
    "Sessions",
    "bearer_token",
    "configured_token",
    "mount_path",
    "same_secret",
    "set_session_cookie",
]
