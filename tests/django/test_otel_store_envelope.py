"""The trace envelope round trip (``tests/otel/test_otel_store_envelope.py``) on
``DjangoStore``, PostgreSQL and SQLite, with this directory's Django test databases; and the
admin's detail page shows the response without the envelope (the traceparent on a line of
its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idempotent_tasks._core import tracing
from idempotent_tasks.django import DjangoStore
from idempotent_tasks.django.admin import decoded_response
from tests.otel.test_otel_store_envelope import (
    PARENT,
    test_otel_trace_envelope_round_trips_on_every_store,  # noqa: F401 - collected here too
)


@pytest.fixture
def store(alias: str) -> Iterator[DjangoStore]:
    yield DjangoStore(using=alias)


def test_otel_the_admin_shows_the_response_without_the_envelope(alias: str) -> None:
    shown = decoded_response(tracing.wrap(b'{"charged": 10}', PARENT))
    assert shown == f'traceparent: {PARENT}\n{{\n  "charged": 10\n}}'
    assert decoded_response(b'{"charged": 10}') == '{\n  "charged": 10\n}'
