"""The ``Idempotency-Key`` field, parsed once for every HTTP integration (ASGI, WSGI,
Django): pure Python, no framework.

The IETF draft defines the field as an RFC 8941 *sf-string* (``Idempotency-Key: "8e03…"``);
many clients send the bare value (``Idempotency-Key: 8e03…``).  Both are the same key:

* ``"…"`` is unquoted, its escapes ``\\"`` and ``\\\\`` decoded (any other backslash is
  refused, as RFC 8941 says);
* a bare value is taken as it is, surrounding spaces and tabs trimmed;
* refused as ``INVALID_KEY``: an empty value or ``""``, a list or a comma outside quotes
  (two fields joined by a WSGI server as ``a, b`` or ``a,b``), parameters (``;`` after or
  outside the string), an unbalanced or inner quote, bytes that are not UTF-8, and two
  fields seen separately.

The key handed to the engine is the unquoted text, so the 255-character limit applies to
the key and not to its quotes, and operators pass the same unquoted key to
``idempotent-tasks inspect`` and ``handler.get_record``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core.errors import ErrorCode, InvalidInputError

#: What surrounds a field value and is not part of it (HTTP's optional whitespace).
_OWS = " \t"
#: Characters that make a bare value something else than one plain key.
_STRUCTURE = {",": "a list (a comma outside quotes)", ";": "parameters", '"': "an inner quote"}


def _invalid(reason: str) -> InvalidInputError:
    return InvalidInputError(
        f"the Idempotency-Key header is not one key: {reason}", code=ErrorCode.INVALID_KEY
    )


def parse_key(fields: Sequence[bytes | str]) -> str | None:
    """The key carried by the ``Idempotency-Key`` field lines of one request (``None`` when
    there is none).  ``str`` values are taken as PEP 3333 / Django ``META`` give them:
    latin-1 decoded bytes, repeated fields already joined with commas (so WSGI and Django
    pass ``[] if value is None else [value]``; ASGI passes every field it received).

    Args:
        fields: The request's ``Idempotency-Key`` field values, in order.

    Returns:
        The key, or ``None`` when the request carries no such field.

    Raises:
        InvalidInputError: ``INVALID_KEY``: the fields do not carry exactly one non-empty
            key (an RFC 8941 string or token).
    """
    if not fields:
        return None
    if len(fields) > 1:
        raise _invalid("more than one Idempotency-Key field")
    raw = fields[0]
    if isinstance(raw, str):
        raw = raw.encode("latin-1", "replace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("not valid UTF-8") from None
    return parse_value(text)


def parse_value(text: str) -> str:
    """One field value (text) → the key; :class:`InvalidInputError` ``INVALID_KEY`` when
    it is not exactly one non-empty key."""
    value = text.strip(_OWS)
    if not value:
        raise _invalid("empty")
    if value.startswith('"'):
        return _sf_string(value)
    for char, reason in _STRUCTURE.items():
        if char in value:
            raise _invalid(reason)
    return value


def _sf_string(value: str) -> str:
    """RFC 8941 section 4.2.5 on ``value`` (which starts with ``"``); nothing may follow
    the closing quote."""
    out: list[str] = []
    i, end = 1, len(value)
    while i < end:
        char = value[i]
        if char == "\\":
            if i + 1 >= end or value[i + 1] not in '"\\':
                raise _invalid("a backslash that escapes neither a quote nor a backslash")
            out.append(value[i + 1])
            i += 2
            continue
        if char == '"':
            return _closed("".join(out), value[i + 1:])
        out.append(char)
        i += 1
    raise _invalid("an unbalanced quote")


def _closed(key: str, rest: str) -> str:
    if rest:
        reason = _STRUCTURE.get(rest.lstrip(_OWS)[:1], "text after the closing quote")
        raise _invalid(reason)
    if not key:
        raise _invalid('an empty string ("")')
    return key


__all__ = ["parse_key", "parse_value"]
