"""RabbitMQ helpers for the reconnect tests (consumer loop, Celery, Dramatiq): a vhost of
the test's own, and the broker closing its connections on command — each close verified.

``rabbitmqctl`` takes a second or two per call (it starts an Erlang node), so the tests
call it only to create and delete their vhost and to close and list connections.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Callable
from urllib.parse import quote

from tests._wait import wait_until as _wait_until

from .._services import require


def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True,
                          timeout=60)
    return done.stdout.decode(errors="replace")


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    _wait_until(condition, what, timeout, poll=0.05)  # a broker or a process doing the work


class Vhost:
    """A vhost of our own: closing its connections touches no one else's."""

    def __init__(self) -> None:
        require("rabbitmq")
        self.name = f"reconnect-{uuid.uuid4().hex[:8]}"
        rabbitmqctl("add_vhost", self.name)
        rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")

    def url(self, port: int = 5672, scheme: str = "amqp") -> str:
        return f"{scheme}://guest:guest@127.0.0.1:{port}/{quote(self.name, safe='')}"

    def connections(self) -> dict[str, str]:
        """Connection process id → state, for this vhost's connections (``close_connection``
        takes the process id, not the ``client -> server`` name)."""
        out = rabbitmqctl("list_connections", "--no-table-headers", "pid", "vhost", "state")
        found = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("\t")]
            if len(parts) == 3 and parts[1] == self.name:
                found[parts[0]] = parts[2]
        return found

    def running(self) -> set[str]:
        return {pid for pid, state in self.connections().items() if state == "running"}

    def close_all(self, reason: str = "reconnect-test") -> set[str]:
        """``rabbitmqctl close_connection`` on every open connection of the vhost; verified:
        each is closing or gone afterwards (a client busy in a body does not read its socket,
        so the broker may list it as ``closing`` until it does).  Returns their ids."""
        wait_until(lambda: bool(self.running()), f"a connection to {self.name}")
        before = self.running()
        for pid in before:
            rabbitmqctl("close_connection", pid, reason)
        wait_until(lambda: not before & self.running(), "the broker to close the connections")
        return before

    def delete(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            rabbitmqctl("delete_vhost", self.name)


class ConnectionKiller:
    """The two ways a client's broker connection dies, each verified:

    * ``close_connection`` — the broker closes it (``rabbitmqctl close_connection``): the
      client is told (``CONNECTION_FORCED``);
    * ``tcp_reset`` — the network aborts it: the client connects through a loopback TCP
      proxy (``tests/_proxy.py``) that resets both sides; the client learns it from a
      failed read or write.
    """

    def __init__(self, kind: str, vhost: Vhost) -> None:
        from tests._proxy import TCPProxy

        self.kind, self.vhost = kind, vhost
        self.proxy = TCPProxy(5672).start() if kind == "tcp_reset" else None
        self._closed: set[str] = set()
        self._accepted = 0

    def url(self) -> str:
        """The URL the client under test connects to."""
        return self.vhost.url(self.proxy.port) if self.proxy is not None else self.vhost.url()

    def kill(self) -> int:
        """Kill every connection of the client; returns how many there were."""
        if self.proxy is None:
            self._closed = self.vhost.close_all()
            return len(self._closed)
        wait_until(lambda: self.proxy is not None and self.proxy.open_connections > 0,
                   "a connection through the proxy")
        count, self._accepted = self.proxy.open_connections, self.proxy.accepted
        self.proxy.drop()
        assert self.proxy.open_connections == 0, "a connection survived the reset"
        self.proxy.forward()
        return count

    def reconnected(self) -> bool:
        """Has the client opened a new connection since :meth:`kill`?"""
        if self.proxy is None:
            return bool(self.vhost.running() - self._closed)
        return self.proxy.accepted > self._accepted

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
