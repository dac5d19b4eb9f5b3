"""The ``idempotent-tasks`` command group: global options, the store, errors and exit codes.

Operators run these commands from cron, systemd timers and Kubernetes CronJobs, so the
contract is the exit code and one readable error line — never a traceback:

====  =====================================================================
code  meaning
====  =====================================================================
0     success
1     failure: an unexpected error (``INTERNAL_ERROR``), a confirmation that was refused,
      or a demo whose scenarios did not behave as guaranteed
2     usage: bad options or arguments, or an invalid tenant/operation/key
3     ``RECORD_NOT_FOUND``: no (live, or FAILED for ``unpoison``) record for the scope
4     ``STORE_UNAVAILABLE``: the store could not be reached or failed
5     ``CONFIGURATION_ERROR``: bad store URL, missing driver, schema mismatch
====  =====================================================================
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import click
from click.core import ParameterSource
from rich.console import Console
from sqlalchemy.engine import make_url

from .._core.errors import ErrorCode, IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.logging import LOGGER_NAME
from ..stores.base import Store
from ..stores.urls import redact_url, store_from_url, url_scheme

PROG_NAME = "idempotent-tasks"
DEFAULT_STORE_URL = "sqlite:///idempotency.db"
STORE_ENV = "IDEMPOTENT_TASKS_STORE"
PREFIX_ENV = "IDEMPOTENT_TASKS_PREFIX"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_RECORD_NOT_FOUND = 3
EXIT_STORE_UNAVAILABLE = 4
EXIT_CONFIGURATION = 5

_EXIT_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.RECORD_NOT_FOUND: EXIT_RECORD_NOT_FOUND,
    ErrorCode.STORE_UNAVAILABLE: EXIT_STORE_UNAVAILABLE,
    ErrorCode.OUTCOME_NOT_RECORDED: EXIT_STORE_UNAVAILABLE,
    ErrorCode.CONFIGURATION_ERROR: EXIT_CONFIGURATION,
    ErrorCode.MISSING_KEY: EXIT_USAGE,
    ErrorCode.INVALID_KEY: EXIT_USAGE,
    ErrorCode.MISSING_TENANT: EXIT_USAGE,
    ErrorCode.INVALID_TENANT: EXIT_USAGE,
    ErrorCode.INVALID_OPERATION: EXIT_USAGE,
}

_NOT_TERMINAL_WIDTH = 200

#: How a store's ``ConfigurationError`` for a schema that was never created begins; the CLI
#: answers it with exactly this line (and exit 5).
SCHEMA_MISSING = "schema not created: run `idempotent-tasks migrate`"


def exit_code_for(code: ErrorCode) -> int:
    """The documented process exit code for an error code (1 for anything unlisted)."""
    return _EXIT_BY_CODE.get(code, EXIT_FAILURE)


#: The code of a command-line mistake (unknown command or option, missing or invalid
#: argument): click's own usage errors, exit 2.
USAGE_CODE = "USAGE"


class CliError(click.ClickException):
    """An error shown as ``error: CODE: message`` on stderr (``error: CODE: <line>`` when a
    ``line`` is given), exiting with its own code."""

    def __init__(self, code: ErrorCode, message: str, *, line: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.line = line

    @classmethod
    def of(cls, err: IdempotencyError) -> CliError:
        """The CLI's error for a library error: a missing schema says what to run."""
        if err.code is ErrorCode.CONFIGURATION_ERROR and err.message.startswith(SCHEMA_MISSING):
            return cls(err.code, err.message, line=SCHEMA_MISSING)
        return cls(err.code, err.message)

    @property
    def exit_code(self) -> int:  # type: ignore[override]  # click declares a class constant
        return exit_code_for(self.code)

    def format_message(self) -> str:
        return f"{self.code.value}: {self.line or self.message}"

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class CliUsageError(click.UsageError):
    """click's usage error with a code like every other error: the command's usage, then
    ``error: USAGE: message`` (exit 2)."""

    def __init__(self, exc: click.UsageError) -> None:
        super().__init__(exc.format_message(), exc.ctx)

    def show(self, file: Any = None) -> None:
        ctx = self.ctx
        if ctx is not None:
            hint = f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help."
            click.echo(f"{ctx.get_usage()}\n{hint}\n", err=True)
        click.echo(f"error: {USAGE_CODE}: {self.message}", err=True)


def make_console(stderr: bool = False) -> Console:
    """A rich console; when the output is not a terminal, wide enough for record tables."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _NOT_TERMINAL_WIDTH
    return Console(file=stream, width=width, stderr=stderr, highlight=False)


class ClickStderrHandler(logging.Handler):
    """Writes through ``click.echo(err=True)`` so that it follows whatever ``sys.stderr`` is
    at emit time (CliRunner swaps it per invocation).

    Error lines are held until the command ends: when it fails with an error the CLI reports
    itself (``error: ...``), they describe that very error and are dropped, so that every
    error is shown once; otherwise they are shown then.
    """

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.held.append(record)
        else:
            self._echo(record)

    def _echo(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # pragma: no cover - logging must never break a command
            self.handleError(record)

    def drop_held(self) -> None:
        """The command's error is reported by the CLI: its log lines would repeat it."""
        self.held.clear()

    def release_held(self) -> None:
        held, self.held = self.held, []
        for record in held:
            self._echo(record)


@contextmanager
def cli_logging(level: str) -> Iterator[ClickStderrHandler | None]:
    """Show the library's log lines (audit entries, recoveries, store errors) on stderr.

    The CLI is an application, so it may configure logging — but only for the duration of
    the command, restoring the logger afterwards (the CLI also runs inside test processes).
    """
    if level == "off":
        yield None
        return
    logger = logging.getLogger(LOGGER_NAME)
    handler = ClickStderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.release_held()


@dataclass
class CliState:
    """What every command shares: the store URL and options, built lazily (and closed)."""

    url: str
    prefix: str | None
    connect_timeout: float | None = None
    #: Whether this command may bring a database into existence (``migrate`` only): any
    #: other command pointed at a SQLite file that does not exist says so instead of letting
    #: SQLite create an empty file at a mistyped path.
    may_create: bool = False
    #: The command's log handler (``None`` with ``--log-level off``).
    log: ClickStderrHandler | None = field(default=None, repr=False)
    _store: Store | None = field(default=None, repr=False)

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    def store(self) -> Store:
        if self._store is None:
            if not self.may_create:
                _refuse_missing_sqlite_file(self.url, self.prefix)
            self._store = store_from_url(
                self.url, table_prefix=self.prefix, connect_timeout=self.connect_timeout
            )
        return self._store

    def handler(self, **options: Any) -> IdempotencyHandler:
        """A handler for operator commands: no metrics (a short-lived process has no
        scraper), the default logger (so audit entries reach the configured logging)."""
        return IdempotencyHandler(self.store(), metrics=None, **options)

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            try:
                store.close()
            except Exception as exc:  # closing must never hide the command's own outcome
                logging.getLogger(LOGGER_NAME).debug("store_close_failed error=%r", exc)


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names, or ``None`` for another scheme, an in-memory
    database or a ``file:`` URI (whose options SQLite interprets itself)."""
    if url_scheme(url) != "sqlite":
        return None
    try:
        database = make_url(url).database
    except Exception:  # a malformed URL: the store's own error says what is wrong
        return None
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _refuse_missing_sqlite_file(url: str, prefix: str | None) -> None:
    path = sqlite_file(url)
    if path is None or path.exists():
        return
    migrate = f"{PROG_NAME} --store {redact_url(url)}"
    if prefix:
        migrate += f" --prefix {prefix}"
    line = f"no such database: {path} does not exist; schema not created: run `{migrate} migrate`"
    raise CliError(ErrorCode.CONFIGURATION_ERROR, line, line=line)


class IdempotencyGroup(click.Group):
    """Turns library errors into ``error: CODE: message`` plus the documented exit code."""

    _passthrough: ClassVar[tuple[type[BaseException], ...]] = (
        click.ClickException,
        click.exceptions.Exit,
        click.Abort,
    )

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise exc if isinstance(exc, CliUsageError) else CliUsageError(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise exc if isinstance(exc, CliUsageError) else CliUsageError(exc) from None
        except self._passthrough:
            raise
        except IdempotencyError as exc:
            _reported(ctx)
            raise CliError.of(exc) from None
        except Exception as exc:
            if os.environ.get("IDEMPOTENT_TASKS_DEBUG"):
                raise
            _reported(ctx)
            raise CliError(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}") from None


def _reported(ctx: click.Context) -> None:
    """The CLI reports the command's error itself: drop the log lines that repeat it."""
    state = ctx.find_object(CliState)
    if state is not None and state.log is not None:
        state.log.drop_held()


def state_of(ctx: click.Context) -> CliState:
    state = ctx.find_object(CliState)
    if state is None:  # pragma: no cover - every command runs under the group
        raise click.UsageError("run this command through the idempotent-tasks group")
    return state


pass_state = click.make_pass_decorator(CliState)


@click.group(cls=IdempotencyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    "url",
    envvar=STORE_ENV,
    default=DEFAULT_STORE_URL,
    show_default=True,
    show_envvar=True,
    metavar="URL",
    help="Store URL: sqlite:///file.db, postgresql+psycopg://…, redis://…, memory://",
)
@click.option(
    "--table-prefix",
    "--prefix",
    "prefix",
    envvar=PREFIX_ENV,
    default=None,
    show_envvar=True,
    help="Table prefix (SQL) or key prefix (Redis); the store's default when omitted.",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to wait for the store to answer the first connection.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error", "off"], case_sensitive=False),
    default="warning",
    show_default=True,
    help="Library log lines (audit entries, recoveries, store errors) shown on stderr.",
)
@click.version_option(package_name="idempotent-tasks", prog_name=PROG_NAME)
@click.pass_context
def cli(
    ctx: click.Context,
    url: str,
    prefix: str | None,
    connect_timeout: float | None,
    log_level: str,
) -> None:
    """Operate an idempotent_tasks store: schema, recovery, cleanup, inspection, unpoisoning.

    Exit codes: 0 ok, 1 failure, 2 usage, 3 RECORD_NOT_FOUND, 4 STORE_UNAVAILABLE,
    5 CONFIGURATION_ERROR (see docs/operations.md).
    """
    state = CliState(url=url, prefix=prefix, connect_timeout=connect_timeout)
    ctx.obj = state
    ctx.call_on_close(state.close)
    level = log_level.lower()
    if ctx.get_parameter_source("log_level") is ParameterSource.DEFAULT and (
        ctx.invoked_subcommand == "demo"
    ):
        level = "error"  # the demo's report says what happened; its warnings are expected
    state.log = ctx.with_resource(cli_logging(level))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: returns the exit code instead of raising SystemExit."""
    try:
        cli.main(args=argv, prog_name=PROG_NAME, standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return EXIT_OK
        if isinstance(code, int):
            return code
        click.echo(str(code), err=True)
        return EXIT_FAILURE
    return EXIT_OK
