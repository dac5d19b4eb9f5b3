"""moto's DynamoDB server, answering one request at a time: ``python _moto_serial.py HOST PORT``.

``moto_server`` serves each request on its own thread, and moto's ``TransactWriteItems`` is not
isolated from a concurrent one: a cancelled transaction rolls back by restoring a copy of the
whole table taken when it began, erasing whatever another transaction committed meanwhile (seen
here: two recoverers racing one record, the winner's released record kept and its counter
increment lost, about one run in three).  DynamoDB itself serializes conflicting transactions,
so the emulator is run the way that keeps that guarantee: the same moto server application
over HTTP, one request after another.  The store's clients still race each other; only the
emulator's own state changes are serialized, as DynamoDB's are per item.
"""

from __future__ import annotations

import sys

from moto.moto_server.threaded_moto_server import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
