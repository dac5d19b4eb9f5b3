"""Every store keeps a traced execution's response envelope (``tracing.wrap``: a NUL-led
marker, the W3C traceparent, a newline, the serializer's bytes) byte for byte, through
``mark_success``, ``mark_success_many`` and every read (``get``, ``create``'s DUPLICATE,
``create_many``'s).  Run on the store contract suite's own ``store`` fixture: every sync
and async store; ``tests/django/test_otel_store_envelope.py`` runs it on ``DjangoStore``."""

from __future__ import annotations

from idempotent_tasks._core import tracing
from idempotent_tasks._core.records import Scope, Status
from idempotent_tasks.stores.base import ClaimRequest, Store, SuccessWrite

from ..stores import test_store_contract as contract

NOW, claim = contract.NOW, contract.claim
#: The contract suite's fixtures: every sync store and the async ones.
store_kind, store = contract.store_kind, contract.store

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#: Not UTF-8 and not JSON, with NULs: what a custom serializer may write inside it.
BODY = b'{"charged":10}\x00\xff\xfe\n\r\x7f'


def test_otel_trace_envelope_round_trips_on_every_store(store: Store) -> None:
    one, many = Scope("acme", "otel.single", "k-1"), Scope("acme", "otel.batch", "k-2")
    wrapped = tracing.wrap(BODY, PARENT)
    assert wrapped.startswith(b"\x00") and wrapped != BODY
    token = claim(store, one).record.fencing_token
    assert store.mark_success(one, token=token, response=wrapped, now=NOW + 1,
                              expires_at=NOW + 60)
    token = claim(store, many).record.fencing_token
    assert store.mark_success_many([SuccessWrite(many, token, wrapped, NOW + 60)],
                                   now=NOW + 1) == [True]
    for scope in (one, many):
        got = store.get(scope)
        assert got is not None and got.status is Status.SUCCESS
        assert bytes(got.response or b"") == wrapped
        assert tracing.unwrap(bytes(got.response or b"")) == (BODY, PARENT)
        duplicate = claim(store, scope, now=NOW + 2)
        assert not duplicate.created
        assert bytes(duplicate.record.response or b"") == wrapped
    [batch] = store.create_many([ClaimRequest(one, "h1")], now=NOW + 3,
                                lease_expires_at=NOW + 33)
    assert batch is not None and not batch.created
    assert bytes(batch.record.response or b"") == wrapped
