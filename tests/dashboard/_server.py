"""The dashboard served by a real uvicorn server on a free loopback port, in a thread.

The socket is bound and listening before the server thread starts, so a client can connect
at once (the kernel queues the connection until uvicorn accepts it): nothing waits on a
timer for the server to come up.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

#: Seconds the server gets to finish after it is told to stop (a generous budget).
STOP_BUDGET = 60.0


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="dashboard-uvicorn")
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_BUDGET)
        sock.close()
        assert not thread.is_alive(), "the dashboard's server did not stop"
