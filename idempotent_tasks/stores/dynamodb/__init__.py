"""DynamoDB store: records, retry counters and leases as items of one table; every state
change one conditional write.

* Guarantee: every primitive of the store contract (``stores/base.py``) is atomic in
  DynamoDB: a conditional ``PutItem``/``UpdateItem`` on one item, or a ``TransactWriteItems``
  where a change spans the record and its counter.  Every read the contract depends on is
  strongly consistent.  DynamoDB's own durability and multi-AZ replication apply; global
  tables (multi-region, last writer wins) do **not** keep conditional writes atomic across
  regions: use one region per table.
* Atomic primitive — the claim: one ``PutItem`` conditional on "no record" (absent, or a
  *tombstone* of an older attempt) with ``ReturnValuesOnConditionCheckFailure=ALL_OLD``, so
  a duplicate costs **one request** and comes back with the existing record.  A record whose
  ``expires_at`` passed (by the handler's clock) is replaced, and its counter reset, in one
  transaction conditional on the record being unchanged.  Completion, heartbeat, poisoning
  and release are one ``UpdateItem`` each, conditional on ``status = PROCESSING`` and the
  fencing token.  A first delivery therefore costs a ``PutItem`` and an ``UpdateItem`` (one
  write unit each for small items); a duplicate costs one write unit (a refused conditional
  write is billed as a write).
* Counted attempts (a transient failure, a takeover) read the counter and then commit the
  record's conditional update together with the counter's increment (conditional on the
  value read) in one ``TransactWriteItems``: 1 read + 2 transactional writes (twice the
  capacity of plain writes).  A reopen (a settled record given to a new attempt, conditional
  on SUCCESS/FAILED and its token) commits the record's update and the counter's deletion
  in one ``TransactWriteItems``, with no read.  These are the rare paths.
* Fencing tokens: tokens come from blocks of 1000, each claimed with an ``ADD`` on the
  store's token item (``<prefix>#T``) and a conditional ``PutItem`` of the block's marker
  (``<prefix>#B#<n>``, so a block is never used twice even by an emulator whose ``ADD`` is
  not atomic): no two attempts share a token, and each process draws from its block
  locally, so a claim stays one request (a new block costs two writes per 1000 claims, or
  per minute).  A claim whose condition fails never counts as ours, whatever token the
  existing record holds.  A released or purged
  record stays as a tombstone that keeps its last token, and the claim's condition requires
  a token greater than it (a smaller one is refused, and the claim draws from a newer
  block): tokens grow per scope as long as the scope's item lives.  Blocks are kept at most
  60 s, so after the TTL removed a tombstone (``gc_ttl``, default 7 days) a new token is still
  greater than the old ones.
* Items (``pk`` is the only key; ``<digest>`` = the first 32 hex digits of SHA-256 of the
  length-prefixed scope, the scope itself stored and compared on every read)::

      <prefix>#R#<digest>   record: t, o, k (scope), st, rh, rs, tk, ca, ua, le, ex, gp, gs, gc
                            (a tombstone keeps pk, tk and gc only)
      <prefix>#C#<digest>   retry counter: n, ua, t, o, k, gp, gs, gc, and steps (the
                            recorded steps, binary) — outlives its record
      <prefix>#L#<name>     maintenance lease: ow, lx, gc
      <prefix>#T            the token blocks' counter: nb
      <prefix>#B#<n>        the marker of token block n: gc

* Index: the global secondary index ``status-time`` (partition ``gp``, sort ``gs``; every
  record attribute but the response projected) holds each record under
  ``<prefix>#P|S|F|U#<shard>`` — PROCESSING and UNCERTAIN sorted by ``updated_at``,
  SUCCESS/FAILED by ``expires_at`` — and each counter under ``<prefix>#C#<shard>`` sorted
  by its last change.  ``index_shards`` (default 8) spreads each status over that many
  index partitions, so no single index partition takes every claim's write (a hot index
  partition would throttle the table).  Costs: ``find_stuck`` = one Query per shard
  (reading the PROCESSING records oldest first, live leases filtered out) + one strongly
  consistent ``BatchGetItem`` of the candidates (the index is eventually consistent);
  ``delete_expired`` = one Query per status and shard + one conditional write per purged
  record, one Query per shard + one transaction per purged counter (deleted only while the
  scope has no record); ``stats`` reads every index partition; ``list_records`` scans the
  table (operators only).
  Nothing on the hot path queries or scans.  Every record write also writes the index (one
  more write unit per state change).
* Steps and UNCERTAIN (``_effects``): ``save_steps`` is one ``TransactWriteItems`` (a
  ``ConditionCheck`` of the record, PROCESSING with the token, and the counter's
  ``Update``), so whatever deletes the counter removes the steps.  ``mark_uncertain``
  updates the record and removes the TTL attribute of the record and of its counter in one
  transaction (one conditional ``UpdateItem`` when there is no counter): an UNCERTAIN
  record and its steps wait for an operator.  ``resolve_uncertain`` is one conditional
  ``UpdateItem``.
* TTL: expiry and leases are decided by the handler's clock from stored timestamps, never by
  DynamoDB.  The TTL attribute ``gc`` is only garbage collection, set ``gc_ttl`` beyond the
  logical end (lease or expiry) measured by the wall clock; ``gc_ttl`` must exceed the
  handler's ``ttl`` and ``lease_timeout``.  ``delete_expired`` turns expired records into
  tombstones; the TTL removes tombstones, stale leases and forgotten counters.
* Limits: an item is at most 400 KB, so keep ``max_response_bytes`` below ~350 KB with this
  store (a larger response cannot be recorded: ``OUTCOME_NOT_RECORDED``); the same bound
  holds for a scope's recorded steps, all in its counter item.
* Failures: a missing table or index, credentials or region raise
  :class:`~idempotent_tasks.ConfigurationError`; throttling
  (``ProvisionedThroughputExceededException``, ``ThrottlingException``,
  ``RequestLimitExceeded``), transaction conflicts, timeouts and every other service or
  network error raise :class:`~idempotent_tasks.StoreUnavailableError` — fail closed.
  The clients the store builds make no automatic retries (a retried conditional write can
  report a stale outcome); a client passed in is used as it is.
* Configuration: ``DynamoDBStore(table_name, *, client=None, endpoint_url=None,
  region_name=None, prefix="", gc_ttl=7 days, index_shards=8, connect_timeout=5,
  read_timeout=10, batch_concurrency=16)``; ``create_table()`` creates the table (on-demand
  capacity), the index and the TTL setting.  URL: ``dynamodb://TABLE?region=…&endpoint_url=…``.
  Batches (``create_many``, ``mark_success_many``) send one request per scope, in parallel.
  Needs ``pip install 'idempotent-tasks[dynamodb]'``.
"""

from __future__ import annotations

from ._client import CONFIGURATION_CODES, TOKEN_BLOCK, UNAVAILABLE_CODES, translate
from ._items import INDEX
from ._plumbing import DEFAULT_GC_TTL, DEFAULT_INDEX_SHARDS
from ._store import DynamoDBStore

__all__ = [
    "CONFIGURATION_CODES",
    "DEFAULT_GC_TTL",
    "DEFAULT_INDEX_SHARDS",
    "INDEX",
    "TOKEN_BLOCK",
    "UNAVAILABLE_CODES",
    "DynamoDBStore",
    "translate",
]
