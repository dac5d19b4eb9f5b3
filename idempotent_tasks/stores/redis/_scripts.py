"""The Redis stores' plans and how scripts run in them, with no driver in sight.

A *plan* is a generator: it yields what to send and receives what Redis replied, so a
primitive that takes several steps (the claim that finds an expired record, a batch, a scan,
the reload of a script the server forgot) is written once and driven by either transport
(``_transport.py``: a blocking one for :class:`RedisStore`, an awaiting one for
:class:`AsyncRedisStore`), in the way ``httpx.Auth.auth_flow`` serves both httpx clients.

What a plan yields:

* a ``tuple``: one command's arguments, e.g. ``("EVALSHA", sha, 3, *keys, *args)``;
* a ``list`` of tuples: sent in one round trip on one connection (a pipeline); the plan
  receives the replies in order, the server's error replies in place;
* a :class:`Scan`: every key name matching a pattern (on every primary of a Cluster).

Errors come back as values too: a server's error reply (``NOSCRIPT``, ``READONLY``, ...) or
the driver's exception when a step could not be carried out (connection lost, timeout) is
sent into the plan *in place of the reply*, as the exception object.  A plan handles what it
can (a NOSCRIPT reload, the best-effort withdrawal of ``_replication``) and raises the rest;
what leaves a plan as a driver error becomes ``StoreUnavailableError`` at the transport.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

from ..._core.records import Scope
from ._client import SCRIPTS, script_sha, script_text
from ._records import Keys, Shard, shards

T = TypeVar("T")
#: One command: its arguments, command name first.
Command: TypeAlias = tuple[Any, ...]
#: Calls of one script: (keys, args) each.
Calls: TypeAlias = Sequence[tuple[Sequence[Any], Sequence[Any]]]


class Scan:
    """Every key name matching ``pattern`` (a glob), as a list."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern


#: What a plan yields: one command, a pipeline of them, or a key scan.
Step: TypeAlias = Command | list[Command] | Scan
#: A plan that returns a ``T``: it yields steps and is sent their replies.
Plan: TypeAlias = Generator[Step, Any, T]


class ReplicaWaiting(Protocol):
    """What the plans need of ``WAIT`` after a write (``_replication.ReplicaWaits``)."""

    names: frozenset[str]
    wait: Command

    def judge(
        self, plans: ScriptPlans, name: str, calls: Calls, commands: Sequence[Command],
        replies: list[Any],
    ) -> Plan[list[Any]]: ...


def checked(reply: Any) -> Any:
    """``reply``, unless it is an error: then that error is raised."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


def all_checked(replies: Any) -> list[Any]:
    """The replies of a pipeline, unless it failed or one is an error reply: then that
    error (the first) is raised."""
    for reply in checked(replies):
        if isinstance(reply, BaseException):
            raise reply
    return list(replies)


class ScriptPlans:
    """Running the scripts: ``EVALSHA``, loading a script once more when the server does not
    know it (first use, restart, failover; ``NOSCRIPT`` means nothing ran, so sending it
    again is safe), and ``WAIT`` after the writes that need replicas (``_replication``).

    A primitive runs a script as ``step = script(...)``, ``reply = yield step``, and only
    when ``step`` waited for replicas or ``reply`` is an error reply ``settle(...)``: the
    common case is one flat step of its own plan (:meth:`eval` is the same as a plan)."""

    def __init__(
        self,
        prefix: str,
        *,
        gc_ttl: float,
        cluster: bool,
        noscript: type[BaseException],
        errors: tuple[type[BaseException], ...],
        waits: ReplicaWaiting | None = None,
    ) -> None:
        self.prefix = prefix
        #: Redis Cluster: a script may touch one hash slot only (batches go per shard).
        self.cluster = cluster
        self.noscript = noscript
        self.errors = errors
        self.gc_ms = str(int(gc_ttl * 1000)).encode()  # encoded once, sent with every write
        self.shards: dict[str, Shard] = shards(prefix)
        self.shas = {name: script_sha(name) for name in SCRIPTS}
        #: ``WAIT`` after claims and outcome writes (``_replication``); None: never.
        self.waits = waits

    def keys(self, scope: Scope) -> Keys:
        return Keys(scope, self.shards)

    def script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Step:
        """The step that runs ``lua/<name>.lua`` once: its ``EVALSHA``, followed by ``WAIT``
        in the same round trip when the script's writes wait for replicas."""
        command = ("EVALSHA", self.shas[name], len(keys), *keys, *args)
        waits = self.waits
        if waits is None or name not in waits.names:
            return command
        return [command, waits.wait]

    def settle(self, name: str, step: Step, reply: Any) -> Plan[Any]:
        """The script's reply, from what ``step`` (made by :meth:`script`) was answered when
        that was not a plain reply: NOSCRIPT (load, send again), another error reply
        (raised), or a step that waited for replicas (``_replication``)."""
        if isinstance(step, tuple):
            return (yield from self.again(name, step, reply))
        assert self.waits is not None and isinstance(step, list)
        command = step[0]
        calls = [(command[3 : 3 + command[2]], ())]
        return (yield from self.waits.judge(self, name, calls, [command], reply))[0]

    def eval(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Plan[Any]:
        """One call of ``lua/<name>.lua``; its reply (an error reply is raised)."""
        step = self.script(name, keys, args)
        reply = yield step
        if type(step) is not tuple or isinstance(reply, BaseException):
            reply = yield from self.settle(name, step, reply)
        return reply

    def again(self, name: str, command: Command, error: BaseException) -> Plan[Any]:
        """After ``error``: when it is NOSCRIPT, load the script and send ``command`` again."""
        if not isinstance(error, self.noscript):
            raise error
        yield from self.load(name)
        return checked((yield command))

    def load(self, name: str) -> Plan[None]:
        """``SCRIPT LOAD`` (named in one word, as redis-py's own ``script_load`` sends it,
        so that either Cluster client sends it to every primary)."""
        checked((yield ("SCRIPT LOAD", script_text(name))))

    def eval_many(self, name: str, calls: Calls) -> Plan[list[Any]]:
        """Several calls of one script: as one call when there is one, else in one pipeline;
        each call stays atomic on its own.  The first error reply is raised."""
        if len(calls) == 1:
            return [(yield from self.eval(name, *calls[0]))]
        commands = [("EVALSHA", self.shas[name], len(k), *k, *a) for k, a in calls]
        waits = self.waits
        if waits is not None and name in waits.names:
            replies = yield [*commands, waits.wait]
            return (yield from waits.judge(self, name, calls, commands, replies))
        return all_checked((yield from self.resend_missing(name, commands, [], (yield commands))))

    def resend_missing(
        self, name: str, commands: Sequence[Command], tail: Sequence[Command], replies: list[Any]
    ) -> Plan[list[Any]]:
        """``replies`` to ``commands`` (calls of script ``name``) and then ``tail``, sent in
        one round trip: the calls refused with NOSCRIPT are sent again, with ``tail`` again
        after them, once the script is loaded (``tail``'s replies are then those of the
        second round)."""
        checked(replies)  # the round trip itself failed
        count = len(commands)
        missing = [i for i, r in enumerate(replies[:count]) if isinstance(r, self.noscript)]
        if missing:
            yield from self.load(name)
            again: list[Any] = checked((yield [*(commands[i] for i in missing), *tail]))
            for i, reply in zip(missing, again, strict=False):
                replies[i] = reply
            replies[count:] = again[len(missing) :]
        return replies
