"""The records in Django's admin: a read-only list and detail, and the audited "unpoison"
action.

* list: filter by status, operation and tenant; search by key; newest records last (the
  store's own order);
* detail: every field, the timestamps as UTC dates, the retry counter (kept apart from the
  record, read through the handler) and the stored response decoded (an HTTP response shows
  its status, headers and body);
* "Unpoison": for each selected FAILED record, ``handler.unpoison(actor="django-admin:<user>")``
  — the record is deleted and its counter reset, with the same audit log entry
  (``unpoisoned``) as ``idempotent-tasks unpoison``; other statuses are left alone.  It needs
  the ``idempotent_tasks.unpoison_idempotencyrecord`` permission (superusers have it).

Nothing else can change a record here: adding, editing and deleting are refused.  The app
registers this on ``admin.site`` when ``django.contrib.admin`` is installed; call
:func:`register` for another ``AdminSite``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.utils.html import format_html

from .._core.errors import IdempotencyError, RecordNotFoundError
from .._core.records import Status
from .._core.tracing import unwrap
from . import _settings

UNPOISON_PERMISSION = "idempotent_tasks.unpoison_idempotencyrecord"
F = TypeVar("F", bound=Callable[..., Any])


def _display(**options: Any) -> Callable[[F], F]:
    decorate: Callable[[F], F] = admin.display(**options)
    return decorate


def _action(**options: Any) -> Callable[[F], F]:
    decorate: Callable[[F], F] = admin.action(**options)
    return decorate


def _when(value: float | None) -> str:
    if value is None:
        return "—"
    return datetime.fromtimestamp(value, UTC).isoformat(sep=" ", timespec="milliseconds")


def decoded_response(raw: bytes | None) -> str:
    """The stored response as readable text (an HTTP response with its body decoded; the
    traceparent a traced execution keeps beside it on a line of its own)."""
    if raw is None:
        return "—"
    encoded, parent = unwrap(bytes(raw))
    trace = "" if parent is None else f"traceparent: {parent}\n"
    try:
        value = _settings.get_handler().serializer.loads(encoded)
    except Exception as exc:  # a record written with another serializer
        return f"{trace}(cannot decode: {type(exc).__name__}) {encoded[:2000]!r}"
    if isinstance(value, dict) and {"status", "headers", "body"} <= set(value):
        body = base64.b64decode(value["body"])
        value = {**value, "body": body.decode("utf-8", "replace")}
    return trace + json.dumps(value, indent=2, ensure_ascii=False, default=str)


class RecordAdmin(admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("key", "tenant", "operation", "status", "created", "expires")
    list_filter = ("status", "operation", "tenant")
    search_fields = ("key",)
    actions = ("unpoison",)
    fields = (
        "tenant", "operation", "key", "status", "retry_count", "fencing_token",
        "request_hash", "created", "updated", "lease_expires", "expires", "response_decoded",
    )
    readonly_fields = fields

    def get_urls(self) -> list[Any]:
        """The list page (where the action runs) outside ``ATOMIC_REQUESTS``: unpoisoning
        writes the store, whose writes must commit on their own."""
        urls: list[Any] = super().get_urls()
        for url in urls:
            if str(getattr(url, "name", "")).endswith("_changelist"):
                for alias in settings.DATABASES:  # the URLs are built once per process
                    transaction.non_atomic_requests(using=alias)(url.callback)
        return urls

    # -- read-only --------------------------------------------------------------------------
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_unpoison_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm(UNPOISON_PERMISSION))

    # -- columns ----------------------------------------------------------------------------
    @_display(description="created (UTC)", ordering="created_at")
    def created(self, obj: Any) -> str:
        return _when(obj.created_at)

    @_display(description="updated (UTC)")
    def updated(self, obj: Any) -> str:
        return _when(obj.updated_at)

    @_display(description="lease expires (UTC)")
    def lease_expires(self, obj: Any) -> str:
        return _when(obj.lease_expires_at)

    @_display(description="expires (UTC)", ordering="expires_at")
    def expires(self, obj: Any) -> str:
        return _when(obj.expires_at)

    @_display(description="retry counter")
    def retry_count(self, obj: Any) -> int:
        handler = _settings.get_handler()
        return handler.retry_count(operation=obj.operation, tenant=obj.tenant, key=obj.key)

    @_display(description="response (decoded)")
    def response_decoded(self, obj: Any) -> Any:
        return format_html("<pre>{}</pre>", decoded_response(obj.response))

    # -- the one action ---------------------------------------------------------------------
    @_action(description="Unpoison the selected FAILED records", permissions=["unpoison"])
    def unpoison(self, request: Any, queryset: Any) -> None:
        handler = _settings.get_handler()
        actor = f"django-admin:{request.user.get_username()}"
        done, skipped = 0, 0
        for record in queryset:
            if record.status != Status.FAILED.value:
                skipped += 1
                continue
            try:
                handler.unpoison(
                    operation=record.operation, tenant=record.tenant, key=record.key, actor=actor
                )
                done += 1
            except RecordNotFoundError:
                skipped += 1  # gone (or no longer FAILED) since the page was shown
            except IdempotencyError as err:
                self.message_user(request, f"{record}: {err.code.value}: {err.message}",
                                  messages.ERROR)
        self.message_user(request, f"unpoisoned {done} record(s) as {actor}; {skipped} "
                          "skipped (not FAILED)", messages.SUCCESS if done else messages.WARNING)


def register(site: admin.AdminSite) -> None:
    """Register the records' admin on ``site`` (once)."""
    from .models import define

    model = define().IdempotencyRecord
    if not site.is_registered(model):
        site.register(model, RecordAdmin)


__all__ = ["UNPOISON_PERMISSION", "RecordAdmin", "decoded_response", "register"]
