"""Staged Celery tasks, published with ``app.send_task`` on one producer per batch.

The task id is the staged key and the headers carry ``idempotency_key`` /
``idempotency_tenant``, so an ``IdempotentTask`` receiving a republished message finds the
same scope and replays instead of running again.  Durability is the app's: on RabbitMQ set
``broker_transport_options={"confirm_publish": True}`` so that ``send_task`` returns only once
the broker has the message (the publisher logs ``outbox_celery_unconfirmed`` otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._core.keys import KEY_OPTION, TENANT_OPTION
from ._base import SENT, PublishResult, rejected, unavailable

if TYPE_CHECKING:
    from .._table import OutboxRow


class CeleryPublisher:
    """Publishes ``celery`` rows through ``app`` (its broker, serializer and routes)."""

    kind = "celery"

    def __init__(self, app: Any, *, log: Any = None) -> None:
        import kombu.exceptions

        self.app = app
        self._down: tuple[type[BaseException], ...] = (
            kombu.exceptions.OperationalError, ConnectionError, OSError, TimeoutError,
        )
        options = app.conf.broker_transport_options or {}
        if log is not None and str(app.conf.broker_url or "").startswith(("amqp", "pyamqp")) and (
            not options.get("confirm_publish")
        ):
            log.warning("outbox_celery_unconfirmed", broker="amqp",
                        hint="broker_transport_options={'confirm_publish': True}")

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        results: list[PublishResult] = []
        try:
            with self.app.producer_or_acquire() as producer:
                for row in rows:
                    results.append(self._send(producer, row))
                    if results[-1].state == "unavailable":
                        break
        except self._down as exc:
            results.append(unavailable(exc))
        failed = results[-1] if results and results[-1].state == "unavailable" else None
        while len(results) < len(rows):
            results.append(failed or unavailable("the producer could not be acquired"))
        return results[: len(rows)]

    def _send(self, producer: Any, row: OutboxRow) -> PublishResult:
        fields = row.fields
        options = dict(fields.get("options") or {})
        headers = {**(options.pop("headers", None) or {}), KEY_OPTION: row.key,
                   TENANT_OPTION: row.tenant}
        try:
            self.app.send_task(
                fields["name"], args=list(fields.get("args") or ()),
                kwargs=dict(fields.get("kwargs") or {}), task_id=row.key, headers=headers,
                producer=producer, **options,
            )
        except self._down as exc:
            return unavailable(exc)
        except Exception as exc:  # the message itself (an option the broker refuses, …)
            return rejected(exc)
        return SENT

    def close(self) -> None:
        return None


__all__ = ["CeleryPublisher"]
