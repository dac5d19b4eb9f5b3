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
import importlib
import itertools
import json
import json.scanner
import uuid
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)  # exact types: one set look-up on the common path
_STR = itertools.repeat(str)
_STR_TYPE = frozenset((str,))
#: Dicts up to this size are checked by a Python loop (``_check_keys``).
_SMALL = 8


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
    kind = type(value)  # exact types first: a payload is most often a plain dict of scalars
    if kind is dict and len(value) <= _SMALL:
        # Done for speed: for a few entries this loop costs half the set-based C checks of
        # ``_check_container`` (each builds and frees a set).
        for k, v in value.items():
            if type(k) is not str or type(v) not in _SCALAR_TYPES:
                break
        else:
            return
    elif kind is not dict and (kind in _SCALAR_TYPES or not isinstance(value, dict | list | tuple)):
        return
    _check_container(value, depth)


def _check_container(value: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int) -> None:
    """``_check_keys`` for a dict, list or tuple."""
    if depth > 500:
        raise SerializationError("value is nested too deeply")
    if isinstance(value, dict):
        # C loops, no Python frame per key: plain str keys (one set test), else subclasses
        if not _STR_TYPE.issuperset(map(type, value)) and not all(map(isinstance, value, _STR)):
            bad = next(k for k in value if not isinstance(k, str))
            raise SerializationError(f"dict keys must be strings, got {type(bad).__name__}")
        values: Any = value.values()
    else:
        values = value
    if not _SCALAR_TYPES.issuperset(map(type, values)):
        for item in values:
            if type(item) not in _SCALAR_TYPES:
                _check_keys(item, depth + 1)


def _c_encoder() -> Callable[[Any, int], list[str]] | None:
    """The canonical encoder, built once.  ``JSONEncoder.encode`` builds a new C encoder on
    every call; building it once keeps every call in C (same output: sorted keys, compact
    separators, UTF-8 text, no NaN/Infinity, ``default`` for the extra types).  ``None`` on
    interpreters without the C accelerator."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover
        return None
    # markers None: no shared cycle bookkeeping (a dict reused across calls could keep ids
    # after a failed call); cycles are refused earlier, by _check_keys' depth limit.
    encoder: Callable[[Any, int], list[str]] = make(
        None, _default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
    return encoder


class JSONSerializer:
    """Canonical JSON (see the module docstring)."""

    def __init__(self) -> None:
        self._c_encode = _c_encoder()
        self._py_encoder = json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
            default=_default,
        )
        self._decoder = json.JSONDecoder()
        scanner = getattr(json.scanner, "c_make_scanner", None)
        self._scan = None if scanner is None else scanner(self._decoder)

    def dumps(self, value: Any) -> bytes:
        try:
            _check_keys(value)
            encode = self._c_encode
            if encode is None:  # pragma: no cover - no C accelerator
                return self._py_encoder.encode(value).encode("utf-8")
            return "".join(encode(value, 0)).encode("utf-8")
        except SerializationError:
            raise
        except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, data: bytes) -> Any:
        try:
            # What dumps wrote is UTF-8: decode it directly rather than have json.loads
            # sniff the encoding of every stored response.
            text = (
                data.decode("utf-8")
                if type(data) is bytes or isinstance(data, bytes | bytearray) else data
            )
            scan = self._scan
            if scan is not None:
                try:
                    value, end = scan(text, 0)  # what dumps wrote: one value, no whitespace
                except StopIteration:  # not at position 0: let the full decoder say why
                    end = -1
                if end == len(text):
                    return value
            return self._decoder.decode(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SerializationError(str(exc)) from exc


DEFAULT_SERIALIZER = JSONSerializer()


def request_hash(encoded_payload: bytes) -> str:
    """Hex SHA-256 of the canonical encoding."""
    digest: str = _sha256(encoded_payload).hexdigest()
    return digest


def _pick_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 where it has one: for the short inputs hashed here it costs
    less than a round through OpenSSL's EVP layer.  Same digest either way."""
    for module in ("_sha2", "_sha256"):  # 3.12+, 3.11
        try:
            return importlib.import_module(module).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256  # pragma: no cover


_sha256 = _pick_sha256()
