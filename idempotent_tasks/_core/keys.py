"""Keys derived from keys: one encoding for every child key the library makes (canvas
signatures, tasks enqueued from a protected body, staged outbox messages).

The parts are length-prefixed before hashing, so no two different tuples of parts share an
encoding (``("a|b", "c")`` and ``("a", "b|c")`` differ), and the key is the hex SHA-256:
64 characters whatever the parents' lengths, valid under the 255-character key limit.
"""

from __future__ import annotations

import hashlib

#: Where the idempotency key and tenant travel: the HTTP field and broker header names
#: (matched case-insensitively, ``-`` or ``_``) ...
KEY_HEADER = "idempotency-key"
TENANT_HEADER = "idempotency-tenant"
#: ... and the same names spelled as Python identifiers: Celery message headers, Dramatiq
#: message options, ``apply_async`` / ``send_with_options`` keywords.
KEY_OPTION = KEY_HEADER.replace("-", "_")
TENANT_OPTION = TENANT_HEADER.replace("-", "_")


def derive_key(*parts: str) -> str:
    """The hex SHA-256 of the length-prefixed ``parts``."""
    encoded = "|".join(f"{len(p)}:{p}" for p in parts).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()


__all__ = ["KEY_HEADER", "KEY_OPTION", "TENANT_HEADER", "TENANT_OPTION", "derive_key"]
