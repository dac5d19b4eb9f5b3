"""``resolve``: the audited way to settle an UNCERTAIN scope (a crashed attempt whose effects
reconciliation could not tell), as ``handler.resolve`` does."""

from __future__ import annotations

import json
from typing import Any

import click

from .._core.errors import ErrorCode
from .._core.records import Status
from ._app import CliError, CliState, make_console, pass_state
from ._records import _default_actor, _load
from ._render import echo_json, record_document, record_table


def _parsed(done: str) -> Any:
    try:
        return json.loads(done)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--done") from exc


@click.command()
@click.argument("tenant")
@click.argument("operation")
@click.argument("key")
@click.option("--done", "done", default=None, metavar="JSON",
              help="The effect happened: record SUCCESS with this result (JSON).")
@click.option("--retry", is_flag=True, help="Release the scope: the next delivery runs it.")
@click.option("--fail", is_flag=True, help="Poison the scope (FAILED).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts).")
@click.option("--actor", default=None, help="Who does this, for the audit entry [$USER].")
@click.option("--json", "as_json", is_flag=True, help="Print the new state as JSON.")
@pass_state
def resolve(
    state: CliState, tenant: str, operation: str, key: str, done: str | None, retry: bool,
    fail: bool, yes: bool, actor: str | None, as_json: bool,
) -> None:
    """Settle an UNCERTAIN record: --done JSON (SUCCESS with that result, replayed from then
    on), --retry (released: the next delivery runs the body, replaying recorded steps) or
    --fail (FAILED).  Logs an audit entry ("uncertain_resolved").

    Only UNCERTAIN records qualify: exit 3 for a scope without one.
    """
    if (done is not None) + retry + fail != 1:
        raise click.UsageError("give exactly one of --done JSON, --retry, --fail")
    result = _parsed(done) if done is not None else None
    handler = state.handler()
    current = _load(handler, tenant, operation, key)
    if current.status is not Status.UNCERTAIN:
        raise CliError(
            ErrorCode.RECORD_NOT_FOUND,
            f"the scope is {current.status.value}, not UNCERTAIN: there is nothing to resolve",
        )
    console = make_console()
    now = handler.clock()
    if not yes:
        console.print(record_table(record_document(current, now), now, "record to resolve"))
        click.confirm("Resolve this UNCERTAIN record?", abort=True)
    who = f"cli:{actor or _default_actor()}"
    given: dict[str, Any] = {"done": result} if done is not None else (
        {"retry": True} if retry else {"fail": True}
    )
    after = handler.resolve(operation=current.operation, tenant=current.tenant,
                            key=current.key, by=who, **given)
    resolution = next(iter(given))
    doc = None if after is None else record_document(after, handler.clock())
    if as_json:
        echo_json({"resolved": resolution, "actor": who, "record": doc})
        return
    if doc is not None:
        console.print(record_table(doc, handler.clock(), "resolved"))
    click.echo(f"resolved ({resolution}) by {who}")
