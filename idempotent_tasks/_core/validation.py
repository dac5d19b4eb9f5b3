"""Validation of (tenant, operation, key) before anything runs."""

from __future__ import annotations

import re

from .errors import ErrorCode, InvalidInputError

MAX_PART_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def validate_part(
    value: object, *, what: str, missing: ErrorCode, invalid: ErrorCode
) -> str:
    """Return ``value`` as ``str`` or raise the right 400-class error.

    Rules: present and non-empty; text (``bytes`` must be UTF-8); at most 255 characters;
    encodable as UTF-8 (no lone surrogates); no control characters.  Values are compared
    exactly: no Unicode normalisation, so confusable keys stay distinct keys.
    """
    if value is None or value in {"", b""}:
        raise InvalidInputError(f"{what} is required", code=missing)
    text = _as_text(value)
    if text is None:
        raise InvalidInputError(f"{what} must be UTF-8 text", code=invalid)
    if len(text) > MAX_PART_LENGTH:
        raise InvalidInputError(
            f"{what} is longer than {MAX_PART_LENGTH} characters", code=invalid
        )
    if not text.strip():
        raise InvalidInputError(f"{what} is blank", code=invalid)
    if _CONTROL.search(text):
        raise InvalidInputError(f"{what} contains control characters", code=invalid)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} is not valid UTF-8", code=invalid) from None
    return text


def validate_key(value: object) -> str:
    # Keys are unique per message: the one part checked on every call.  The common case,
    # accepted by validate_part's rules in a few C calls: a non-blank printable ASCII str of
    # at most 255 characters (for ASCII, printable means no control characters).
    if (
        type(value) is str and value.isascii() and value.isprintable()
        and 0 < len(value) <= MAX_PART_LENGTH and not value.isspace()
    ):
        return value
    return validate_part(
        value, what="idempotency key", missing=ErrorCode.MISSING_KEY, invalid=ErrorCode.INVALID_KEY
    )


def validate_tenant(value: object) -> str:
    return validate_part(
        value, what="tenant", missing=ErrorCode.MISSING_TENANT, invalid=ErrorCode.INVALID_TENANT
    )


def validate_operation(value: object) -> str:
    return validate_part(
        value,
        what="operation",
        missing=ErrorCode.INVALID_OPERATION,
        invalid=ErrorCode.INVALID_OPERATION,
    )
