"""The ``idempotent-tasks`` command line (reference: docs/operations.md).

``main`` is the console-script entry point; ``cli`` is the click group, for embedding
(``CliRunner().invoke(cli, [...])``) or adding commands.
"""

from __future__ import annotations

from ._app import (
    EXIT_CONFIGURATION,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_RECORD_NOT_FOUND,
    EXIT_STORE_UNAVAILABLE,
    EXIT_USAGE,
    cli,
    exit_code_for,
    main,
)
from ._dashboard import dashboard
from ._demo import demo
from ._maintenance import cleanup, migrate, recover
from ._outbox import outbox, relay
from ._records import inspect, list_, stats, unpoison
from ._resolve import resolve

for _command in (
    migrate, recover, cleanup, inspect, list_, stats, unpoison, resolve, demo, relay, outbox
):
    cli.add_command(_command)
cli.add_command(dashboard)

__all__ = [
    "EXIT_CONFIGURATION",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_RECORD_NOT_FOUND",
    "EXIT_STORE_UNAVAILABLE",
    "EXIT_USAGE",
    "cli",
    "exit_code_for",
    "main",
]

if __name__ == "__main__":  # python -m idempotent_tasks.cli
    raise SystemExit(main())
