"""DynamoDBStore's client, its errors translated at the boundary, and the fencing-token blocks.

Errors: a missing table or index, bad credentials or region are configuration errors
(retrying never helps); throttling, capacity, transaction conflicts, timeouts and every
other service or transport error are outages: ``STORE_UNAVAILABLE``, fail closed.  Expected
answers (a failed condition, a cancelled transaction) are handled by the store before this
translation and never reach it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from ..._core.errors import ConfigurationError, IdempotencyError, StoreUnavailableError
from ._items import GC, Keys, gc_at

INSTALL_HINT: Final = "DynamoDBStore needs boto3: pip install 'idempotent-tasks[dynamodb]'"
#: Error codes whose fix is configuration, not waiting.
CONFIGURATION_CODES: Final = frozenset({
    "ResourceNotFoundException", "AccessDeniedException", "UnrecognizedClientException",
    "InvalidSignatureException", "MissingAuthenticationTokenException",
    "IncompleteSignatureException", "ExpiredTokenException",
})
#: Error codes that are an outage (the rest are too: fail closed); listed for the docs/tests.
UNAVAILABLE_CODES: Final = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "InternalServerError", "ServiceUnavailable", "TransactionConflictException",
    "TransactionInProgressException", "LimitExceededException",
})
_CONFIG_BOTOCORE: Final = frozenset({
    "NoRegionError", "NoCredentialsError", "PartialCredentialsError", "ProfileNotFound",
    "UnknownServiceError", "ParamValidationError",
})
#: Tokens handed out per block, and how long a process may keep drawing from one.
TOKEN_BLOCK: Final = 1000
BLOCK_SECONDS: Final = 60.0
_BLOCK_ATTEMPTS: Final = 20


def build_client(
    endpoint_url: str | None, region_name: str | None, connect_timeout: float,
    read_timeout: float, pool: int,
) -> Any:
    """A low-level DynamoDB client without automatic retries (a retried conditional write
    can report a stale outcome; the handler retries with its own backoff)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigurationError(INSTALL_HINT) from exc
    config = Config(
        connect_timeout=connect_timeout, read_timeout=read_timeout,
        retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=pool,
    )
    return boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region_name,
                        config=config)


def error_code(exc: BaseException) -> str | None:
    """The service's error code of a botocore ``ClientError`` (None for other errors)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "")) or None
    return None


def translate(what: str, table: str, exc: BaseException) -> IdempotencyError:
    """The library's error for a driver error raised by ``what``."""
    code = error_code(exc)
    detail = f"{type(exc).__name__}: {exc}".strip()
    message = f"dynamodb store (table {table!r}): {what} failed: {detail}"
    if code in CONFIGURATION_CODES or type(exc).__name__ in _CONFIG_BOTOCORE:
        hint = " (create it: store.create_table() or `idempotent-tasks migrate`)"
        return ConfigurationError(message + (hint if code == "ResourceNotFoundException" else ""))
    if code == "ValidationException" and "size" not in str(exc).lower():
        return ConfigurationError(message)  # e.g. the index is missing: not an outage
    return StoreUnavailableError(message)


@contextlib.contextmanager
def translated(what: str, table: str) -> Iterator[None]:
    """Translate every botocore error raised inside (``raise … from exc``)."""
    try:
        yield
    except IdempotencyError:
        raise
    except Exception as exc:
        if not _is_botocore(exc):
            raise
        raise translate(what, table, exc) from exc


def _is_botocore(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("botocore", "boto3", "urllib3"))


class TokenBlocks:
    """Fencing tokens from blocks of ``TOKEN_BLOCK`` numbers, one block per process at a time.

    A block is claimed with one atomic ``ADD`` on the store's token item, so blocks never
    overlap (tokens are unique) and every new block lies above all earlier ones.  Drawing a
    token is then local: the hot path stays one request per claim.  A process keeps a block
    at most ``BLOCK_SECONDS``, so a token is never older than that; a forked child starts a
    block of its own (the parent's would be drawn twice)."""

    def __init__(self, keys: Keys, table: str, gc_ttl: float) -> None:
        self._keys = keys
        self._table = table
        self._gc_ttl = gc_ttl
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0
        self._taken_at = 0.0
        self._pid = os.getpid()

    def draw(self, client: Any, above: int = 0) -> int | None:
        """A token no attempt ever had, greater than ``above`` (an earlier attempt's); None
        when ``above`` lies beyond every block taken so far — no attempt of this store can
        hold such a token, so a write conditional on it cannot succeed anyway."""
        with self._lock:
            fresh = self._pid == os.getpid() and time.monotonic() - self._taken_at < BLOCK_SECONDS
            if not fresh or self._next >= self._end or self._next <= above:
                self._take(client)
            if self._next <= above:
                return None
            token = self._next
            self._next += 1
            return token

    def _take(self, client: Any) -> None:
        """Claim the next block: one ``ADD`` on the counter, then a conditional ``PutItem``
        of the block's marker, so a block is never used twice even where the ``ADD`` is not
        atomic (moto's emulation answers duplicates under concurrency; DynamoDB does not)."""
        for _ in range(_BLOCK_ATTEMPTS):
            answer = client.update_item(
                TableName=self._table, Key=self._keys.tokens, UpdateExpression="ADD nb :one",
                ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="UPDATED_NEW",
            )
            block = int(answer["Attributes"]["nb"]["N"])
            marker = {"pk": {"S": f"{self._keys.prefix}#B#{block}"},
                      GC: gc_at(BLOCK_SECONDS, self._gc_ttl)}
            try:
                client.put_item(TableName=self._table, Item=marker,
                                ConditionExpression="attribute_not_exists(pk)")
            except Exception as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                continue  # another process got the same number: take the next one
            self._next, self._end = block * TOKEN_BLOCK, (block + 1) * TOKEN_BLOCK
            self._taken_at = time.monotonic()
            self._pid = os.getpid()
            return
        raise StoreUnavailableError("dynamodb store: no token block after several attempts")
