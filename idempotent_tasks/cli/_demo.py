"""``demo``: the command wrapper; the demo itself lives in :mod:`idempotent_tasks.demo.run`
and is imported only when the command runs (it pulls in Celery and Dramatiq).  The demo
never imports the CLI (the dependency goes one way): the console comes from here."""

from __future__ import annotations

import shutil

import click
from click.core import ParameterSource
from rich.console import Console

from ._app import EXIT_OK, CliState, pass_state

#: The demo's report is laid out for 80 columns; wider terminals and files get this width too.
DEMO_MAX_WIDTH = 80


def demo_console() -> Console:
    """A console as wide as the terminal (``COLUMNS`` first, as every terminal program
    does), at most :data:`DEMO_MAX_WIDTH`; output that is not a terminal gets that width."""
    columns = shutil.get_terminal_size((DEMO_MAX_WIDTH, 24)).columns
    return Console(width=min(columns, DEMO_MAX_WIDTH), highlight=False)


@click.command()
@click.option("--store", "store_url", default=None, metavar="URL",
              help="Run on this store instead of a SQLite file in a temporary directory.")
@click.option("--keep", is_flag=True, help="Keep the temporary directory (and its SQLite file).")
@pass_state
@click.pass_context
def demo(ctx: click.Context, state: CliState, store_url: str | None, keep: bool) -> None:
    """Run duplicate, concurrent, failing and crashing deliveries through the core handler,
    Celery and Dramatiq, and report what ran once, replayed, was poisoned or recovered.

    Exits 1 when anything did not behave as guaranteed.  Uses the group's --store only when
    it was given on the command line (never the environment's production store), and the
    group's --prefix.  A framework that is not installed is skipped with its install hint.
    """
    from ..demo.run import run_demo

    parent = ctx.parent
    explicit = (
        parent is not None
        and parent.get_parameter_source("url") is ParameterSource.COMMANDLINE
    )
    if store_url is None and explicit:
        store_url = state.url
    code = run_demo(store_url, prefix=state.prefix, keep=keep, console=demo_console())
    if code != EXIT_OK:
        ctx.exit(code)
