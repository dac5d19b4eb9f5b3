"""``dashboard``: serve the operator dashboard over the store given by ``--store``.

It listens on loopback unless told otherwise, and is read-only unless an operator token is
set in ``IDEMPOTENT_TASKS_DASHBOARD_TOKEN`` (never on the command line, where every user of
the machine could read it in the process list).
"""

from __future__ import annotations

import os

import click

from .._core.errors import ErrorCode
from ._app import CliError, CliState, pass_state

#: Defaults repeated from ``idempotent_tasks.dashboard`` so that ``--help`` works without the
#: dashboard's extra installed.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8044
TOKEN_ENV = "IDEMPOTENT_TASKS_DASHBOARD_TOKEN"


@click.command()
@click.option("--store", "store_url", default=None, metavar="URL",
              help="The store to show (overrides the global --store / IDEMPOTENT_TASKS_STORE).")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on (loopback by default; put a TLS proxy in front "
                   "of anything else).")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=DEFAULT_PORT,
              show_default=True, help="Port to listen on.")
@pass_state
def dashboard(state: CliState, store_url: str | None, host: str, port: int) -> None:
    """Serve the operator dashboard: counts, stuck records, a filtered record list, each
    record's details, and the audited unpoison / resolve actions.

    Actions need the operator token from $IDEMPOTENT_TASKS_DASHBOARD_TOKEN (sign in on the
    page, or send Authorization: Bearer TOKEN); without it the dashboard is read-only.
    """
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        raise CliError(
            ErrorCode.CONFIGURATION_ERROR,
            f"the dashboard needs its extra: pip install 'idempotent-tasks[dashboard]' ({exc})",
        ) from None
    if store_url is not None:  # ``idempotent-tasks dashboard --store URL``
        state.url = store_url
    handler = state.handler()
    handler.record_counts()  # fail now, with the CLI's exit code, if the store is unusable
    mode = "actions need the operator token" if os.environ.get(TOKEN_ENV) else (
        f"read-only: set {TOKEN_ENV} to allow actions")
    click.echo(f"dashboard for {state.display_url} on http://{host}:{port}/ ({mode})", err=True)
    uvicorn.run(create_app(handler), host=host, port=port, log_level="warning")


__all__ = ["dashboard"]
