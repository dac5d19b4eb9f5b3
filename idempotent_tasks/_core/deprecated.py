"""The handler's former public attributes that now answer with a ``DeprecationWarning``."""

from __future__ import annotations

#: Engine steps and internals that were public attributes of the handler before 0.2: each
#: still answers, with a DeprecationWarning that says what to use instead.
DEPRECATED: dict[str, str] = {
    **dict.fromkeys(
        ("prepare", "hash_payload", "encode_response", "decode", "decode_kept", "to_record",
         "expired", "debug", "lease_lost", "unkeyed", "read_count", "read_count_async",
         "read_count_from", "scope", "io", "cache", "cache_mode", "offloader", "heartbeat",
         "serializer", "outcome_retry_timeout"),
        "use run/run_async/execute and Outcome instead",
    ),
    "log": "use handler.logger",
    "store": "keep your own reference to the store you passed in",
}


__all__ = ["DEPRECATED"]
