"""Serialization of payloads (for hashing) and results (for storage and replay).

The default is JSON that encodes what kombu's JSON does (datetime/date/time as ISO 8601,
Decimal and UUID as strings) plus Enums (their value) and dataclasses / pydantic models (as
dicts).  Output is canonical: sorted keys, no whitespace, UTF-8, no NaN/Infinity, tuples as
lists, and non-string dict keys refused (``json`` would silently turn ``{1: x}`` into
``{"1": x}``, making two different payloads hash alike).  The same encoding is used for the
request hash and for stored responses, so a fresh result and its replay are the same
round trip.  Nothing here ever unpickles.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import uuid
from typing import Any, Protocol, runtime_checkable

_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)  # exact types: one set look-up on the common path


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back.  ``dumps`` must be deterministic: it is hashed."""

    def dumps(self, value: Any) -> bytes:
        ...

    def loads(self, data: bytes) -> Any:
        ...


class SerializationError(ValueError):
    """A value the serializer cannot encode (or bytes it cannot decode)."""


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic v2 models
        return model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _check_keys(value: Any, depth: int = 0) -> None:
    """Refuse non-string dict keys anywhere in ``value``."""
    if type(value) in _SCALAR_TYPES or isinstance(value, _SCALARS):
        return
    if depth > 500:
        raise SerializationError("value is nested too deeply")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise SerializationError(f"dict keys must be strings, got {type(k).__name__}")
            if type(v) not in _SCALAR_TYPES:
                _check_keys(v, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            if type(item) not in _SCALAR_TYPES:
                _check_keys(item, depth + 1)


class JSONSerializer:
    """Canonical JSON (see the module docstring)."""

    def __init__(self) -> None:
        self._encoder = json.JSONEncoder(
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_default,
        )
        self._decoder = json.JSONDecoder()

    def dumps(self, value: Any) -> bytes:
        try:
            _check_keys(value)
            return self._encoder.encode(value).encode("utf-8")
        except SerializationError:
            raise
        except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, data: bytes) -> Any:
        try:
            # What dumps wrote is UTF-8: decode it directly rather than have json.loads
            # sniff the encoding of every stored response.
            text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
            return self._decoder.decode(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SerializationError(str(exc)) from exc


DEFAULT_SERIALIZER = JSONSerializer()


def request_hash(encoded_payload: bytes) -> str:
    """Hex SHA-256 of the canonical encoding."""
    return hashlib.sha256(encoded_payload).hexdigest()
