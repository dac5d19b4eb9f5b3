"""``wait_replicas``: writes that are acknowledged only once replicas have them.

Redis replicates asynchronously: a primary acknowledges a claim before any replica has it,
and a failover to a replica that missed it forgets the claim — a second worker then claims
the scope afresh and the body runs twice.  With ``RedisStore(..., wait_replicas=N)`` every
write the guarantee rests on is followed by ``WAIT N timeout`` on the same connection, in
the same round trip (pipelined after the script), and is acknowledged only when at least
``N`` replicas confirmed it:

* **claims** (``create``, ``create_many``, ``take_over``, ``reopen``) and **heartbeats** —
  before the body runs.  A ``WAIT`` short of ``N`` raises ``STORE_UNAVAILABLE``: the body
  does not run (fail closed).  A claim that was made on the primary is withdrawn first
  (released with its own token, best effort), so the redelivery can claim again at once
  instead of waiting out a lease no one holds; a takeover's counted attempt stays counted,
  and a reopened record is gone (its settled outcome was already given up by the reopen).
* **outcome writes** (``mark_success``, ``mark_success_many``, ``mark_failed``,
  ``record_failure``, ``release``, ``mark_uncertain``) — after the body ran.  A short
  ``WAIT`` raises ``OUTCOME_NOT_RECORDED``, not ``STORE_UNAVAILABLE``: the write did happen
  on the primary, so retrying it would be refused by its own condition and could not tell
  success from a lost lease; the integrations then do not ack/commit, and the lease decides
  (docs/design.md, "Fail closed").
* A call that wrote nothing (a duplicate, a refused conditional write) is answered as
  usual whatever ``WAIT`` says: there is nothing of its own to lose.  Its ``WAIT`` is still
  sent in the same round trip (whether the script wrote is known only from its reply), so
  while fewer than ``N`` replicas are connected every such call takes ``wait_timeout``.

A script the server does not know yet (first use, restart, failover) is refused with
``NOSCRIPT`` and sent again with a ``WAIT`` of its own, so while replicas lag that first
call waits twice; ``create_schema()`` (``idempotent-tasks migrate``) loads every script.

Not waited for: operator and maintenance writes (``unpoison``'s counter reset, record
deletion, resolving an UNCERTAIN record, purges, index pruning, maintenance leases), whose
loss in a failover is harmless or re-done; nor ``save_steps`` (a step recorded on the
primary only may run again after a failover, as a claim made there may).  Limits:
``WAIT`` covers this connection's own writes only, so a duplicate delivery may still read
(and replay) a SUCCESS another worker wrote that is not replicated yet; a failover that
promotes a replica which did not acknowledge (fewer than all replicas waited for, or a
promotion that ignores replication offsets) can still lose a write; and Redis Cluster is
not supported (``WAIT`` is per node; the store refuses the option there).
See docs/redis.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..._core.errors import OutcomeNotRecordedError, StoreUnavailableError
from ._scripts import Calls, Command, Plan, checked

if TYPE_CHECKING:
    from ._scripts import ScriptPlans

#: Default bound on one write's wait for its replicas, in seconds.
DEFAULT_WAIT_TIMEOUT: Final = 0.5
#: Scripts whose writes come before the body (a short WAIT: STORE_UNAVAILABLE).
BEFORE_BODY: Final = ("claim", "claim_many", "take_over", "reopen", "heartbeat")
#: Scripts whose writes record a body's outcome (a short WAIT: OUTCOME_NOT_RECORDED).
AFTER_BODY: Final = (
    "mark_success", "mark_success_many", "mark_failed", "record_failure", "release",
    "mark_uncertain",
)
#: Keys per claim of ``claim_many.lua`` (record, counter, processing index, ...).
_CLAIM_MANY_KEYS: Final = 6


class ReplicaWaits:
    """Judges the replies of the scripts that wait for replicas (see the module docstring)."""

    def __init__(self, replicas: int, timeout: float) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self.names: frozenset[str] = frozenset(BEFORE_BODY + AFTER_BODY)
        #: Sent after the script calls, in the same round trip.
        self.wait: Command = ("WAIT", replicas, max(1, round(timeout * 1000)))

    def judge(
        self,
        plans: ScriptPlans,
        name: str,
        calls: Calls,
        commands: Sequence[Command],
        replies: list[Any],
    ) -> Plan[list[Any]]:
        """The scripts' replies, from the round trip of ``commands`` (calls of script
        ``name``) and ``WAIT``, once the replicas confirmed (or nothing was written)."""
        replies = yield from plans.resend_missing(name, commands, [self.wait], replies)
        acked = checked(replies.pop())
        for reply in replies:
            checked(reply)
        if acked < self.replicas and any(
            _wrote(name, keys, reply) for (keys, _), reply in zip(calls, replies, strict=True)
        ):
            yield from self._refuse(plans, name, calls, replies, acked)
        return replies

    # -- a write the replicas did not confirm -----------------------------------------------
    def _refuse(
        self, plans: ScriptPlans, name: str, calls: Calls, replies: Sequence[Any], acked: int
    ) -> Plan[None]:
        said = (f"redis store: {name} was not confirmed by {self.replicas} replica(s) within "
                f"{self.timeout}s (WAIT answered {acked})")
        if name in AFTER_BODY:
            raise OutcomeNotRecordedError(
                said + "; it was applied on the primary but is not acknowledged"
            )
        withdrawn = yield from _withdraw(plans, name, calls, replies)
        raise StoreUnavailableError(
            said + (f"; {withdrawn} claim(s) withdrawn" if withdrawn else "")
            + "; the body did not run"
        )


def _withdraw(plans: ScriptPlans, name: str, calls: Calls, replies: Sequence[Any]) -> Plan[int]:
    """Release the claims this call made (each with its own token, without a WAIT), best
    effort: a claim left behind only costs the redelivery a lease's wait."""
    withdrawn = 0
    for record_key, processing, token in _claims_made(name, calls, replies):
        command = ("EVALSHA", plans.shas["release"], 2, record_key, processing, token)
        try:
            reply = yield command
            if isinstance(reply, BaseException):
                reply = yield from plans.again("release", command, reply)
        except plans.errors:  # best effort: the outage itself is what gets reported
            continue
        withdrawn += int(reply == 1)
    return withdrawn


def _claims_made(
    name: str, calls: Calls, replies: Sequence[Any]
) -> list[tuple[str, str, Any]]:
    """(record key, processing index, token) of every claim a claim script made, read from
    its keys (see each script's KEYS) and replies (a created claim is an array)."""
    made: list[tuple[str, str, Any]] = []
    for (keys, _args), reply in zip(calls, replies, strict=True):
        if name == "claim" and isinstance(reply, list):
            made.append((keys[0], keys[1], reply[0]))
        elif name == "take_over" and isinstance(reply, list):
            made.append((keys[0], keys[2], reply[1]))
        elif name == "reopen" and isinstance(reply, list):
            made.append((keys[0], keys[2], reply[0]))
        elif name == "claim_many":
            items = reply if len(keys) > _CLAIM_MANY_KEYS else [reply]
            for i, item in enumerate(items):
                if isinstance(item, list):
                    base = i * _CLAIM_MANY_KEYS
                    made.append((keys[base], keys[base + 2], item[0]))
    return made


def _wrote(name: str, keys: Sequence[Any], reply: Any) -> bool:
    """Did this script call change anything?  (Each script's reply says it: see its header.)"""
    if name in ("claim", "take_over", "reopen", "record_failure"):
        return isinstance(reply, list)
    if name == "claim_many":
        items = reply if len(keys) > _CLAIM_MANY_KEYS else [reply]
        return any(isinstance(item, list) for item in items)
    if name == "mark_success_many":  # an array of 1/0, one per write
        return any(item == 1 for item in reply)
    return bool(reply == 1)  # heartbeat, mark_success, mark_failed, release, mark_uncertain
