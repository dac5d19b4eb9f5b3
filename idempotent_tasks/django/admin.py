"""The records in Django's admin: a read-only list and detail, and the audited "unpoison"
and "resolve" actions.

* list: filter by status, operation and tenant; search by key; newest records last (the
  store's own order);
* detail: every field, the timestamps as UTC dates, the retry counter (kept apart from the
  record, read through the handler) and the stored response decoded (an HTTP response shows
  its status, headers and body), and the scope's past attempts (``handler.get_attempts``:
  the settled attempts ``on_failure="allow_new_attempt"`` or ``reuse_after`` replaced);
* "Unpoison": for each selected FAILED record, ``handler.unpoison(actor="django-admin:<user>")``
  — the record is deleted and its counter reset, with the same audit log entry
  (``unpoisoned``) as ``idempotent-tasks unpoison``; other statuses are left alone.  It needs
  the ``idempotent_tasks.unpoison_idempotencyrecord`` permission (superusers have it);
* "Resolve": for each selected UNCERTAIN record (a crashed attempt whose effect
  reconciliation could not tell), ``handler.resolve(by="django-admin:<user>")`` with
  ``retry=True`` (released: the next delivery runs the body) or ``fail=True`` (FAILED)
  directly, or ``done=<result>`` after an intermediate page that asks for the result as
  JSON — audited (``uncertain_resolved``) like ``idempotent-tasks resolve``; other statuses
  are left alone.  It needs the ``idempotent_tasks.resolve_idempotencyrecord`` permission.

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

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from .._core.errors import IdempotencyError, RecordNotFoundError
from .._core.records import Status
from .._core.tracing import unwrap
from . import _settings

UNPOISON_PERMISSION = "idempotent_tasks.unpoison_idempotencyrecord"
RESOLVE_PERMISSION = "idempotent_tasks.resolve_idempotencyrecord"
#: The intermediate page of "Resolve … as done" (the result to record, as JSON).
RESOLVE_DONE_TEMPLATE = "admin/idempotent_tasks/resolve_done.html"
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


class ResolveDoneForm(forms.Form):  # type: ignore[misc]
    """The result an UNCERTAIN record is resolved with: what a replay returns from then on."""

    result = forms.CharField(
        label="Result (JSON)", initial="null", widget=forms.Textarea(attrs={"rows": 4}),
        help_text="What the crashed attempt's body would have returned; every later "
                  "delivery gets it replayed.",
    )

    def clean_result(self) -> Any:
        try:
            return json.loads(self.cleaned_data["result"])
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from exc


class RecordAdmin(admin.ModelAdmin):  # type: ignore[misc]
    list_display = ("key", "tenant", "operation", "status", "created", "expires")
    list_filter = ("status", "operation", "tenant")
    search_fields = ("key",)
    actions = ("unpoison", "resolve_done", "resolve_retry", "resolve_fail")
    fields = (
        "tenant", "operation", "key", "status", "retry_count", "fencing_token",
        "request_hash", "created", "updated", "lease_expires", "expires", "response_decoded",
        "past_attempts",
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

    def has_resolve_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm(RESOLVE_PERMISSION))

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
        if obj.status == Status.UNCERTAIN.value:  # its bytes are the detail, not a result
            detail = bytes(obj.response or b"").decode("utf-8", "replace")
            return format_html("<pre>uncertain, no result yet: {}</pre>", detail)
        return format_html("<pre>{}</pre>", decoded_response(obj.response))

    @_display(description="past attempts")
    def past_attempts(self, obj: Any) -> Any:
        """The settled attempts a new attempt replaced, oldest first ("—" when none)."""
        handler = _settings.get_handler()
        attempts = handler.get_attempts(operation=obj.operation, tenant=obj.tenant, key=obj.key)
        if not attempts:
            return "—"
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (a.fencing_token, a.status.value, _when(a.settled_at),
             "—" if a.detail is None else a.detail)
            for a in attempts
        ))
        return format_html(
            "<table><thead><tr><th>fencing token</th><th>status</th><th>settled (UTC)</th>"
            "<th>detail</th></tr></thead><tbody>{}</tbody></table>", rows,
        )

    # -- the audited actions ----------------------------------------------------------------
    @_action(description="Unpoison the selected FAILED records", permissions=["unpoison"])
    def unpoison(self, request: Any, queryset: Any) -> None:
        handler = _settings.get_handler()
        actor = _actor(request)
        done, skipped = self._each(request, queryset, Status.FAILED, lambda record: (
            handler.unpoison(operation=record.operation, tenant=record.tenant,
                             key=record.key, actor=actor)
        ))
        self.message_user(request, f"unpoisoned {done} record(s) as {actor}; {skipped} "
                          "skipped (not FAILED)", messages.SUCCESS if done else messages.WARNING)

    @_action(description="Resolve the selected UNCERTAIN records: done (asks for the result)",
             permissions=["resolve"])
    def resolve_done(self, request: Any, queryset: Any) -> TemplateResponse | None:
        """Django's intermediate-page pattern: the first POST (from the list) shows the form,
        the second (``apply``) resolves with the result it carries."""
        form = ResolveDoneForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            self._resolve(request, queryset, {"done": form.cleaned_data["result"]})
            return None
        if not queryset.filter(status=Status.UNCERTAIN.value).exists():
            self.message_user(request, "none of the selected records is UNCERTAIN: nothing "
                              "to resolve", messages.WARNING)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Resolve UNCERTAIN records as done", "opts": self.model._meta,
            "form": form, "records": list(queryset), "uncertain": Status.UNCERTAIN.value,
            "action": "resolve_done", "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "actor": _actor(request),
        }
        return TemplateResponse(request, RESOLVE_DONE_TEMPLATE, context)

    @_action(description="Resolve the selected UNCERTAIN records: retry (the next delivery "
                         "runs)", permissions=["resolve"])
    def resolve_retry(self, request: Any, queryset: Any) -> None:
        self._resolve(request, queryset, {"retry": True})

    @_action(description="Resolve the selected UNCERTAIN records: fail (FAILED)",
             permissions=["resolve"])
    def resolve_fail(self, request: Any, queryset: Any) -> None:
        self._resolve(request, queryset, {"fail": True})

    def _resolve(self, request: Any, queryset: Any, given: dict[str, Any]) -> None:
        handler = _settings.get_handler()
        actor = _actor(request)
        done, skipped = self._each(request, queryset, Status.UNCERTAIN, lambda record: (
            handler.resolve(operation=record.operation, tenant=record.tenant,
                            key=record.key, by=actor, **given)
        ))
        resolution = next(iter(given))
        self.message_user(request, f"resolved {done} record(s) as {resolution} by {actor}; "
                          f"{skipped} skipped (not UNCERTAIN)",
                          messages.SUCCESS if done else messages.WARNING)

    def _each(
        self, request: Any, queryset: Any, status: Status, act: Callable[[Any], object]
    ) -> tuple[int, int]:
        """``act`` on each selected record in ``status``: (done, skipped).  A record that
        left that status since the page was shown is skipped (the store checked it)."""
        done, skipped = 0, 0
        for record in queryset:
            if record.status != status.value:
                skipped += 1
                continue
            try:
                act(record)
                done += 1
            except RecordNotFoundError:
                skipped += 1
            except IdempotencyError as err:
                self.message_user(request, f"{record}: {err.code.value}: {err.message}",
                                  messages.ERROR)
        return done, skipped


def _actor(request: Any) -> str:
    """Who acts, for the audit entry."""
    return f"django-admin:{request.user.get_username()}"


def register(site: admin.AdminSite) -> None:
    """Register the records' admin on ``site`` (once)."""
    from .models import define

    model = define().IdempotencyRecord
    if not site.is_registered(model):
        site.register(model, RecordAdmin)


__all__ = [
    "RESOLVE_DONE_TEMPLATE",
    "RESOLVE_PERMISSION",
    "UNPOISON_PERMISSION",
    "RecordAdmin",
    "ResolveDoneForm",
    "decoded_response",
    "register",
]
