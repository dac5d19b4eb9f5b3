"""A producer process killed between its unique-enqueue mark and its publish.

Its broker URL points at a TCP listener that accepts connections (the kernel's backlog) and
never answers, so the publish blocks in the AMQP handshake; the test SIGKILLs the process
once the mark is in the store.  No hook in the library, no sleep: the window is the hang.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests._wait import wait_until

REPO = Path(__file__).resolve().parents[1]


def kill_at_its_mark(argv: Callable[[int], list[str]], marked: Callable[[], object]) -> None:
    """Run ``python -m <argv(silent_port)>`` and SIGKILL it once ``marked()`` is true."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        producer = subprocess.Popen(
            [sys.executable, "-m", *argv(silent.getsockname()[1])],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            wait_until(lambda: marked() or producer.poll() is not None, "the producer's mark",
                       20.0, poll=0.01)
            assert producer.poll() is None, "the producer ended before it was killed"
        finally:
            producer.send_signal(signal.SIGKILL)
            producer.wait()
