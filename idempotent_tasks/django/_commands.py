"""What the ``idempotency_*`` management commands share with each other and with the
``idempotent-tasks`` CLI: the handler from settings, the CLI's documents and tables, and the
CLI's exit codes (``CommandError(returncode=…)``: 3 ``RECORD_NOT_FOUND``, 4
``STORE_UNAVAILABLE``, 5 ``CONFIGURATION_ERROR``, 2 an invalid scope).

The commands call the handler's public methods only (``get_record``, ``unpoison``,
``recover_stuck_records``, ``cleanup_expired_records``…), with the handler the project's
workers use (``get_handler()``: its ``max_retries``, ``on_stuck`` and ``ttl`` are the
settings', so unlike the CLI they need no flags to match the workers).
"""

from __future__ import annotations

import getpass
import io
import json
import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.table import Table

from .._core.errors import ErrorCode, IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.records import Record
from ..cli._app import EXIT_CONFIGURATION, exit_code_for
from . import _settings

_WIDTH = 200


class HandlerCommand(BaseCommand):  # type: ignore[misc]
    """A management command on ``get_handler()``; library errors become
    ``CommandError``s with the CLI's exit codes."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except IdempotencyError as err:
            raise CommandError(
                f"{err.code.value}: {err.message}", returncode=exit_code_for(err.code)
            ) from err
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=EXIT_CONFIGURATION) from exc

    def handler(self) -> IdempotencyHandler:
        return _settings.get_handler()

    def emit_json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str))

    def emit_table(self, table: Table) -> None:
        buffer = io.StringIO()
        Console(file=buffer, width=_WIDTH, highlight=False).print(table)
        self.stdout.write(buffer.getvalue().rstrip("\n"))

    def add_json_flag(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="Machine-readable output.")


def add_scope_arguments(parser: Any) -> None:
    parser.add_argument("tenant")
    parser.add_argument("operation")
    parser.add_argument("key")


def load_record(handler: IdempotencyHandler, tenant: str, operation: str, key: str) -> Record:
    """The scope's live record, or RECORD_NOT_FOUND naming its counter (as the CLI does)."""
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    if record is None:
        count = handler.retry_count(operation=operation, tenant=tenant, key=key)
        raise IdempotencyError(
            f"no live record for tenant={tenant!r} operation={operation!r} key={key!r} "
            f"(retry counter: {count})", code=ErrorCode.RECORD_NOT_FOUND,
        )
    return record


def default_actor() -> str:
    """Who runs the command, for the audit entry: $USER, else the login name."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "unknown"


__all__ = ["HandlerCommand", "add_scope_arguments", "default_actor", "load_record"]
