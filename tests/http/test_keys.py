"""The ``Idempotency-Key`` field as an RFC 8941 sf-string: the parser on its own, then
through both middlewares (FastAPI over httpx, Flask's test client) on every store — the
quoted and the bare form are one key, and every refused form is 400 ``INVALID_KEY`` with
the endpoint not run, on ASGI and WSGI alike."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, InvalidInputError, Status
from idempotent_tasks.http import parse_key

from ._apps import Script, WSGIDriver, flask_app

PAY = "POST /payments/{id}"
MakeDriver = Callable[..., Any]

ACCEPTED = [
    ([b'"8e03-a1"'], "8e03-a1"),
    ([b"8e03-a1"], "8e03-a1"),
    ([b' \t"8e03-a1" '], "8e03-a1"),
    ([b"  8e03-a1\t"], "8e03-a1"),
    ([rb'"say \"hi\""'], 'say "hi"'),
    ([rb'"back\\slash"'], "back\\slash"),
    ([b'"a,b;c"'], "a,b;c"),  # structure characters are text inside the quotes
    (["clé".encode().decode("latin-1")], "clé"),  # WSGI / Django META: latin-1 text
    (["clé".encode()], "clé"),
    ([b"a b"], "a b"),  # a bare value is taken as it is
]

REFUSED = [
    [b'""'],  # the empty sf-string
    [b""],
    [b"   "],
    [b'"a", "b"'],  # a list
    [b"a, b"],  # two fields joined by a WSGI server
    [b"a,b"],  # ... by gunicorn (no space)
    [b'"a";p=1'],  # parameters
    [b"a;p=1"],
    [b'"abc'],  # unbalanced quote
    [b'ab"c'],  # inner quote
    [b'"a"b"'],
    [b'"a" "b"'],
    [rb'"a\x"'],  # an escape RFC 8941 does not have
    [b'"a\\'],
    [b"a", b"a"],  # two fields seen separately (ASGI)
    [b"\xff\xfe"],  # not UTF-8
]


@pytest.mark.parametrize(("fields", "key"), ACCEPTED)
def test_accepted_forms(fields: list[Any], key: str) -> None:
    assert parse_key(fields) == key


@pytest.mark.parametrize("fields", REFUSED)
def test_refused_forms(fields: list[bytes]) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_key(fields)
    assert info.value.code == "INVALID_KEY"


def test_no_field_is_no_key() -> None:
    assert parse_key([]) is None


# ------------------------------------------------------------------ through the middlewares
def pay(d: Any, key: str | None = None, headers: list[tuple[str, str]] | None = None) -> Any:
    return d.request("POST", "/payments/7", key=key, json={"amount": 1}, headers=headers)


def test_quoted_and_bare_are_one_key(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    key = str(uuid.uuid4())
    quoted = pay(d, f'"{key}"')
    bare = pay(d, key)
    padded = pay(d, f'  "{key}"  ')
    assert quoted.status == bare.status == padded.status == 201
    assert bare.content == padded.content == quoted.content
    assert bare.header("idempotent-replayed") == "true"
    assert script.runs == 1
    record = handler.get_record(operation=PAY, tenant="acme", key=key)  # the unquoted key
    assert record is not None and record.status is Status.SUCCESS
    assert script.contexts[0] is not None and script.contexts[0].key == key


def test_the_255_character_limit_is_on_the_key_not_its_quotes(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script()
    d = make(handler, script)
    longest = "k" * 255
    assert pay(d, f'"{longest}"').status == 201
    assert pay(d, longest).header("idempotent-replayed") == "true"
    too_long = pay(d, f'"{"k" * 256}"')
    assert too_long.status == 400 and too_long.json()["error"]["code"] == "INVALID_KEY"
    assert script.runs == 1


@pytest.mark.parametrize(
    "value", ['""', '"a", "b"', "a, b", "a,b", '"a";p=1', '"abc', 'ab"c', '"a\\x"', ""]
)
def test_refused_forms_are_400_invalid_key_and_nothing_runs(
    make: MakeDriver, handler: IdempotencyHandler, value: str
) -> None:
    script = Script()
    d = make(handler, script)
    r = pay(d, value)
    assert r.status == 400 and r.json()["error"]["code"] == "INVALID_KEY"
    assert script.runs == 0


def test_two_key_fields_are_refused(make: MakeDriver, handler: IdempotencyHandler) -> None:
    """httpx sends both fields to the ASGI app; Werkzeug joins them into one WSGI value
    (``"a, a"``): both are ``INVALID_KEY``, even when the two keys are equal."""
    script = Script()
    d = make(handler, script)
    for first, second in (("a", "a"), ('"a"', '"b"'), ("a", '"a"')):
        r = pay(d, headers=[("Idempotency-Key", first), ("Idempotency-Key", second)])
        assert r.status == 400 and r.json()["error"]["code"] == "INVALID_KEY"
    assert script.runs == 0


def test_an_empty_field_is_refused_even_when_keys_are_optional(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    """A client that sent the field meant a key: an empty one is a bug to report, not a
    request to run without deduplication."""
    script = Script()
    d = make(handler, script, require_key=False)
    r = pay(d, '""')
    assert r.status == 400 and r.json()["error"]["code"] == "INVALID_KEY"
    assert pay(d, None).status == 201  # no field at all: unkeyed, as configured
    assert script.runs == 1


def test_the_cli_inspects_a_quoted_key_by_its_unquoted_form(tmp_path: Path) -> None:
    """An operator types the key as it is, never its quotes."""
    from click.testing import CliRunner

    from idempotent_tasks import SQLStore
    from idempotent_tasks.cli import cli

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = SQLStore(url)
    store.create_schema()
    script = Script()
    d = WSGIDriver(flask_app(IdempotencyHandler(store, metrics=None), script))
    assert pay(d, '"order-77"').status == 201
    result = CliRunner().invoke(
        cli, ["--store", url, "--log-level", "off", "inspect", "acme", PAY, "order-77", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"SUCCESS"' in result.output
    quoted = CliRunner().invoke(
        cli, ["--store", url, "--log-level", "off", "inspect", "acme", PAY, '"order-77"']
    )
    assert quoted.exit_code == 3  # RECORD_NOT_FOUND: the quotes are not part of the key
    store.close()
