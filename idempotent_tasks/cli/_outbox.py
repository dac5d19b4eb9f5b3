"""``relay`` and ``outbox list|stats|retry|drop``: running the outbox relay and tending its rows.

``relay`` publishes what transactional bodies staged (docs/outbox.md) through the publishers
named on the command line, holding a store lease per kind, so it can run beside in-worker
relays: one publishes, the others stand by.  It stops on SIGTERM / SIGINT, giving its leases
up.  ``--once`` publishes what is due and exits (cron, tests).

``outbox retry`` and ``outbox drop`` act on POISONED rows only and log an audit entry each
(``outbox_row_retried`` / ``outbox_row_dropped``); a row id that is not POISONED exits 3.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.table import Table

from .._core.errors import ErrorCode
from .._core.handler import IdempotencyHandler
from ..outbox import Outbox, OutboxRelay, OutboxRow, RowStatus
from ..outbox.publishers import Publisher
from ._app import CliError, CliState, make_console, pass_state
from ._records import _default_actor
from ._render import ago, echo_json, iso


def _load_object(path: str, option: str) -> Any:
    """``module:attribute`` (``module.attribute`` too), as ``celery -A`` takes it."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise click.BadParameter(f"cannot load {path!r}: {exc}", param_hint=option) from exc


def _kafka_config(bootstrap: str, pairs: tuple[str, ...]) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--kafka-config")
        config[name.strip()] = value.strip()
    return config


def _publishers(options: dict[str, Any], handler: IdempotencyHandler) -> list[Publisher]:
    from ..outbox import publishers as p

    made: list[Publisher] = []
    if options["celery_app"]:
        made.append(p.CeleryPublisher(_load_object(options["celery_app"], "--celery-app"),
                                      log=handler.logger))
    if options["dramatiq_broker"]:
        made.append(p.DramatiqPublisher(
            _load_object(options["dramatiq_broker"], "--dramatiq-broker")))
    if options["kafka"]:
        made.append(p.KafkaPublisher(_kafka_config(options["kafka"], options["kafka_config"])))
    if options["rabbitmq"]:
        made.append(p.RabbitMQPublisher(options["rabbitmq"]))
    if not made:
        raise click.UsageError(
            "name at least one broker: --celery-app, --dramatiq-broker, --kafka or --rabbitmq"
        )
    return made


@contextmanager
def _stopped_by_signals() -> Iterator[threading.Event]:
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM,
                                                                      signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command()
@click.option("--celery-app", metavar="MODULE:APP", help="Publish Celery tasks with this app.")
@click.option("--dramatiq-broker", metavar="MODULE:BROKER",
              help="Publish Dramatiq messages on this broker.")
@click.option("--kafka", metavar="SERVERS", help="Publish Kafka records (bootstrap servers).")
@click.option("--kafka-config", multiple=True, metavar="KEY=VALUE",
              help="Extra producer settings (repeatable).")
@click.option("--rabbitmq", metavar="URL", help="Publish RabbitMQ messages (amqp:// URL).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=1.0,
              show_default=True, help="Seconds between polls (PostgreSQL also LISTENs).")
@click.option("--max-attempts", type=click.IntRange(min=1), default=10, show_default=True,
              help="Refusals by the broker before a row is POISONED.")
@click.option("--lease-ttl", type=click.FloatRange(min=1.0), default=60.0, show_default=True,
              help="Seconds a stopped or killed relay's leases outlive it.")
@click.option("--once", is_flag=True, help="Publish what is due, then exit.")
@click.option("--metrics-port", type=click.IntRange(min=0), default=None,
              help="Serve Prometheus metrics on 127.0.0.1:PORT.")
@pass_state
def relay(state: CliState, /, **options: Any) -> None:
    """Publish the outbox's staged messages (until SIGTERM, or --once)."""
    metrics: Any = None
    if options["metrics_port"] is not None:
        from .._core.metrics import PrometheusMetrics
        from ..metrics_server import start_metrics_server

        metrics = PrometheusMetrics()
        start_metrics_server(options["metrics_port"])
    handler = IdempotencyHandler(state.store(), metrics=metrics)
    outbox = Outbox(state.store())
    relay_ = OutboxRelay(handler, outbox, _publishers(options, handler),
                         batch_size=options["batch_size"],
                         poll_interval=options["poll_interval"],
                         max_attempts=options["max_attempts"],
                         lease_ttl=options["lease_ttl"])
    try:
        if options["once"]:
            report = relay_.drain()
            waiting = report.deferred + report.unavailable
            click.echo(f"published {report.published}, rejected {report.rejected}, "
                       f"poisoned {report.poisoned}, waiting {waiting}")
            return
        click.echo(f"relay {relay_.owner} publishing {', '.join(sorted(relay_.publishers))} "
                   f"from {state.display_url}", err=True)
        with _stopped_by_signals() as stop:
            relay_.run(stop)
    finally:
        relay_.stop()


# -- outbox list | stats | retry | drop ---------------------------------------------------------
@click.group()
def outbox() -> None:
    """Inspect the outbox table; retry or drop POISONED rows."""


def _document(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": row.id, "status": row.status.value, "kind": row.kind,
        "destination": row.destination, "tenant": row.tenant, "operation": row.operation,
        "parent_key": row.parent_key, "position": row.position, "key": row.key,
        "attempts": row.attempts, "created_at": row.created_at,
        "created_at_iso": iso(row.created_at), "available_at": row.available_at,
        "sent_at": row.sent_at, "expires_at": row.expires_at, "last_error": row.last_error,
        "fields": dict(row.fields),
    }


def _table(rows: list[OutboxRow], now: float, title: str) -> Table:
    table = Table(title=title)
    for name in ("id", "status", "kind", "destination", "tenant", "operation", "pos",
                 "attempts", "staged", "last error"):
        table.add_column(name)
    for r in rows:
        table.add_row(str(r.id), r.status.value, r.kind, r.destination, r.tenant, r.operation,
                      str(r.position), str(r.attempts), ago(r.created_at, now),
                      (r.last_error or "")[:80])
    return table


@outbox.command(name="list")
@click.option("--status", type=click.Choice([s.value for s in RowStatus]), default=None)
@click.option("--kind", type=click.Choice(["celery", "dramatiq", "kafka", "rabbitmq"]),
              default=None)
@click.option("--tenant", default=None)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@click.option("--json", "as_json", is_flag=True, help="JSON documents instead of a table.")
@pass_state
def list_rows(state: CliState, status: str | None, kind: str | None, tenant: str | None,
              limit: int, offset: int, as_json: bool) -> None:
    """Staged rows, oldest first."""
    box = Outbox(state.store())
    rows = box.rows(status=status, kind=kind, tenant=tenant, limit=limit, offset=offset)
    if as_json:
        echo_json([_document(r) for r in rows])
        return
    make_console().print(_table(rows, state.handler().clock(), f"{len(rows)} outbox rows"))


@outbox.command()
@click.option("--json", "as_json", is_flag=True)
@pass_state
def stats(state: CliState, as_json: bool) -> None:
    """Rows per kind and status."""
    counts = Outbox(state.store()).counts()
    doc = {f"{kind}/{status.value}": n for (kind, status), n in sorted(counts.items())}
    if as_json:
        echo_json(doc)
        return
    table = Table(title="outbox rows")
    for name in ("kind", "status", "rows"):
        table.add_column(name)
    for (kind, status), n in sorted(counts.items()):
        table.add_row(kind, status.value, str(n))
    make_console().print(table)


def _poisoned(box: Outbox, ids: tuple[int, ...]) -> list[OutboxRow]:
    rows = [box.get(i) for i in ids]
    missing = [i for i, r in zip(ids, rows, strict=True)
               if r is None or r.status is not RowStatus.POISONED]
    if missing:
        raise CliError(ErrorCode.RECORD_NOT_FOUND,
                       f"no POISONED outbox row with id {', '.join(map(str, missing))}")
    return [r for r in rows if r is not None]


@outbox.command()
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--actor", default=None, help="Who does this, for the audit entry [$USER].")
@pass_state
def retry(state: CliState, ids: tuple[int, ...], actor: str | None) -> None:
    """Make POISONED rows PENDING again, with a fresh attempt budget."""
    box = Outbox(state.store())
    rows = _poisoned(box, ids)
    handler = state.handler()
    done = box.retry([r.id for r in rows], now=handler.clock())
    for r in rows:
        handler.logger.warning("outbox_row_retried", id=r.id, kind=r.kind,
                            destination=r.destination, tenant=r.tenant, operation=r.operation,
                            attempts=r.attempts, last_error=r.last_error,
                            actor=f"cli:{actor or _default_actor()}")
    click.echo(f"{done} row(s) back to PENDING")


@outbox.command()
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts).")
@click.option("--actor", default=None, help="Who does this, for the audit entry [$USER].")
@pass_state
def drop(state: CliState, ids: tuple[int, ...], yes: bool, actor: str | None) -> None:
    """Delete POISONED rows for good (their messages are never published)."""
    box = Outbox(state.store())
    rows = _poisoned(box, ids)
    handler = state.handler()
    if not yes:
        make_console().print(_table(rows, handler.clock(), "rows to drop"))
        click.confirm("Delete these rows? Their messages will never be published.", abort=True)
    dropped = box.drop([r.id for r in rows])
    for r in dropped:
        handler.logger.warning("outbox_row_dropped", id=r.id, kind=r.kind,
                            destination=r.destination, tenant=r.tenant, operation=r.operation,
                            key=r.key, last_error=r.last_error,
                            actor=f"cli:{actor or _default_actor()}")
    click.echo(f"{len(dropped)} row(s) dropped")


__all__ = ["outbox", "relay"]
