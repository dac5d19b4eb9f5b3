"""The dashboard's routes through Starlette's TestClient: pages, filters, the confirmation
step, and who may act (401 without the token, 403 without the CSRF token or when read-only)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from idempotent_tasks import IdempotencyHandler, Poison, Status
from idempotent_tasks.dashboard import TOKEN_ENV, create_app

from .conftest import TOKEN, Population, csrf_of, park_uncertain


def path_of(scope: tuple[str, str, str]) -> str:
    return "/records/" + "/".join(quote(part, safe="") for part in scope)


@pytest.fixture
def client(handler: IdempotencyHandler, population: Population) -> TestClient:
    return TestClient(create_app(handler, token=TOKEN))


def sign_in(client: TestClient, next_path: str = "/") -> None:
    page = client.get("/login")
    response = client.post(f"/login?next={quote(next_path)}", follow_redirects=False,
                           data={"csrf_token": csrf_of(page.text), "token": TOKEN})
    assert response.status_code == 303, response.text


def test_index_counts_every_status_and_lists_every_record(client: TestClient,
                                                          population: Population) -> None:
    page = client.get("/")
    assert page.status_code == 200
    for status in Status:
        assert f">{status.value}</th>" in page.text
    for scope in (population.executed, population.poisoned, population.stuck, population.live):
        assert path_of(scope) in page.text
    stuck_section = page.text.split('id="stuck"')[1].split('id="list"')[0]
    assert path_of(population.stuck) in stuck_section
    assert path_of(population.live) not in stuck_section
    assert "secret-card-token" not in page.text
    assert "script-src" not in page.headers["content-security-policy"]
    assert "default-src 'none'" in page.headers["content-security-policy"]


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ("status=FAILED", ["poisoned"], ["executed", "stuck"]),
        ("status=PROCESSING", ["stuck", "live"], ["executed", "poisoned"]),
        ("status=SUCCESS", ["executed", "replayed"], ["poisoned", "live"]),
        ("operation=orders.ship", ["stuck", "live"], ["executed"]),
        ("tenant=acme", ["executed", "poisoned"], ["stuck"]),
        ("tenant=acme&status=SUCCESS", ["executed"], ["poisoned", "stuck"]),
    ],
)
def test_filters(client: TestClient, population: Population, query: str,
                 shown: list[str], hidden: list[str]) -> None:
    listed = client.get(f"/?{query}").text.split('id="list"')[1]
    for name in shown:
        assert path_of(getattr(population, name)) in listed, name
    for name in hidden:
        assert path_of(getattr(population, name)) not in listed, name


def test_a_status_that_does_not_exist_is_a_bad_request(client: TestClient) -> None:
    page = client.get("/?status=DONE")
    assert page.status_code == 400
    assert "PROCESSING, SUCCESS, FAILED" in page.text


def test_record_page_shows_state_but_the_result_only_when_asked(
    client: TestClient, population: Population
) -> None:
    page = client.get(path_of(population.executed))
    assert page.status_code == 200
    for text in ("SUCCESS", "Retry counter", "Fencing token", "Request hash", "Created (UTC)"):
        assert text in page.text
    assert "secret-card-token" not in page.text
    shown = client.get(path_of(population.executed) + "?show=response")
    assert "secret-card-token" in shown.text


def test_record_page_of_a_stuck_record_says_so(client: TestClient,
                                               population: Population) -> None:
    page = client.get(path_of(population.stuck))
    assert "PROCESSING" in page.text and "stuck: expired" in page.text


def test_parts_with_slashes_and_spaces_round_trip(client: TestClient,
                                                  population: Population) -> None:
    assert "/" in population.poisoned[2]
    page = client.get(path_of(population.poisoned))
    assert page.status_code == 200 and "FAILED" in page.text


def test_record_page_shows_the_past_attempts(
    client: TestClient, handler: IdempotencyHandler, population: Population
) -> None:
    tenant, operation, key = population.poisoned
    assert "Past attempts" not in client.get(path_of(population.poisoned)).text
    poisoned = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert poisoned is not None

    def declined_again() -> None:
        raise Poison(result="<b>declined</b>")

    handler.run(declined_again, operation=operation, tenant=tenant, key=key,
                on_failure="allow_new_attempt")
    page = client.get(path_of(population.poisoned))
    assert page.status_code == 200 and "Past attempts" in page.text
    assert f"<td>{poisoned.fencing_token}</td>" in page.text
    assert "Unpoison" in page.text  # the new attempt is poisoned too
    handler.run(lambda: "paid", operation=operation, tenant=tenant, key=key,
                on_failure="allow_new_attempt")
    page = client.get(path_of(population.poisoned))
    assert page.text.count('<span class="status status-FAILED">FAILED</span>') == 2
    assert "&#34;&lt;b&gt;declined&lt;/b&gt;&#34;" in page.text  # the detail, escaped


def test_a_scope_without_a_record_is_404_with_its_counter(client: TestClient) -> None:
    page = client.get("/records/acme/payments.charge/never-seen")
    assert page.status_code == 404
    assert "retry counter: 0" in page.text


def test_actions_are_posts(client: TestClient, population: Population) -> None:
    assert client.get(path_of(population.poisoned) + "/unpoison").status_code == 405


def test_without_a_configured_token_the_dashboard_is_read_only(
    handler: IdempotencyHandler, population: Population, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    client = TestClient(create_app(handler))
    page = client.get(path_of(population.poisoned) + "?confirm=unpoison")
    assert "read-only" in page.text and "Confirm unpoison" not in page.text
    refused = client.post(path_of(population.poisoned) + "/unpoison",
                          headers={"Authorization": "Bearer anything"},
                          data={"csrf_token": "whatever"})
    assert refused.status_code == 403
    assert handler.get_record(operation=population.poisoned[1], tenant=population.poisoned[0],
                              key=population.poisoned[2]) is not None


def test_the_token_comes_from_the_environment(
    handler: IdempotencyHandler, population: Population, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    client = TestClient(create_app(handler))
    csrf = csrf_of(client.get("/login").text)
    done = client.post(path_of(population.poisoned) + "/unpoison", follow_redirects=False,
                       headers={"Authorization": f"Bearer {TOKEN}"}, data={"csrf_token": csrf})
    assert done.status_code == 303


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {TOKEN}"}])
def test_no_or_a_wrong_token_is_401(client: TestClient, population: Population,
                                    headers: dict[str, str]) -> None:
    csrf = csrf_of(client.get("/login").text)
    refused = client.post(path_of(population.poisoned) + "/unpoison", headers=headers,
                          data={"csrf_token": csrf})
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("csrf", [None, "forged"])
def test_a_missing_or_wrong_csrf_token_is_403(client: TestClient, population: Population,
                                              csrf: str | None) -> None:
    sign_in(client)
    data = {} if csrf is None else {"csrf_token": csrf}
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        refused = client.post(path_of(population.poisoned) + "/unpoison", headers=headers,
                              data=data)
        assert refused.status_code == 403, headers


def test_login_checks_csrf_and_token_and_issues_a_new_session(client: TestClient) -> None:
    page = client.get("/login")
    before = client.cookies.get("idempotent_tasks_dashboard")
    assert client.post("/login", data={"token": TOKEN}).status_code == 403
    wrong = client.post("/login", data={"csrf_token": csrf_of(page.text), "token": "nope"})
    assert wrong.status_code == 401 and "not the operator token" in wrong.text
    sign_in(client)
    assert client.cookies.get("idempotent_tasks_dashboard") not in (None, before)


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "\\\\evil"])
def test_login_never_redirects_off_the_dashboard(client: TestClient, target: str) -> None:
    page = client.get("/login")
    done = client.post(f"/login?next={quote(target)}", follow_redirects=False,
                       data={"csrf_token": csrf_of(page.text), "token": TOKEN})
    assert done.headers["location"] == "/"


def test_unpoison_after_the_confirmation_runs_the_next_delivery(
    client: TestClient, handler: IdempotencyHandler, population: Population,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tenant, operation, key = population.poisoned
    page = client.get(path_of(population.poisoned))
    assert "Unpoison…" in page.text and "Confirm unpoison" not in page.text
    assert "Sign in" in client.get(path_of(population.poisoned) + "?confirm=unpoison").text
    sign_in(client, path_of(population.poisoned) + "?confirm=unpoison")
    confirm = client.get(path_of(population.poisoned) + "?confirm=unpoison")
    assert "Confirm unpoison" in confirm.text
    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        done = client.post(path_of(population.poisoned) + "/unpoison",
                           data={"csrf_token": csrf_of(confirm.text)})
    assert done.status_code == 200 and "Unpoisoned" in done.text
    assert "dashboard:testclient" in done.text
    assert any("unpoisoned" in r.getMessage() and "dashboard:testclient" in r.getMessage()
               for r in caplog.records)
    outcome = handler.run(lambda: "ran again", operation=operation, tenant=tenant, key=key)
    assert outcome.kind == "executed" and outcome.result == "ran again"


def test_unpoisoning_a_record_that_is_not_failed_changes_nothing(
    client: TestClient, handler: IdempotencyHandler, population: Population
) -> None:
    sign_in(client)
    csrf = csrf_of(client.get("/login").text)
    refused = client.post(path_of(population.executed) + "/unpoison", data={"csrf_token": csrf})
    assert refused.status_code == 404
    tenant, operation, key = population.executed
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert record is not None and record.status is Status.SUCCESS


class WithoutResolve:
    """A handler as an app might wrap it, forwarding everything but ``resolve`` (as before
    the UNCERTAIN status): the dashboard must say it cannot resolve, not fail."""

    def __init__(self, handler: IdempotencyHandler) -> None:
        self._handler = handler

    def __getattr__(self, name: str) -> Any:
        if name in ("resolve", "resolve_async"):
            raise AttributeError(name)
        return getattr(self._handler, name)


@pytest.fixture
def uncertain(handler: IdempotencyHandler, population: Population) -> tuple[str, str, str]:
    return park_uncertain(handler, population)


def test_resolve_without_handler_support_is_501(
    handler: IdempotencyHandler, uncertain: tuple[str, str, str]
) -> None:
    client = TestClient(create_app(WithoutResolve(handler), token=TOKEN))  # type: ignore[arg-type]
    page = client.get(path_of(uncertain) + "?confirm=resolve")
    assert "cannot resolve UNCERTAIN records" in page.text and "Confirm resolve" not in page.text
    sign_in(client)
    csrf = csrf_of(client.get("/login").text)
    answer = client.post(path_of(uncertain) + "/resolve",
                         data={"csrf_token": csrf, "outcome": "retry"})
    assert answer.status_code == 501 and "resolve()" in answer.text
    tenant, operation, key = uncertain
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert record is not None and record.status is Status.UNCERTAIN


def test_uncertain_records_are_counted_filtered_and_listed_apart(
    client: TestClient, population: Population, uncertain: tuple[str, str, str]
) -> None:
    page = client.get("/")
    counts = page.text.split('id="counts"')[1].split("</table>")[0]
    assert '<a href="/?status=UNCERTAIN">1</a>' in counts
    section = page.text.split('id="uncertain"')[1].split('id="list"')[0]
    assert path_of(uncertain) in section and path_of(population.stuck) not in section
    listed = client.get("/?status=UNCERTAIN").text.split('id="list"')[1]
    assert path_of(uncertain) in listed and path_of(population.stuck) not in listed
    assert path_of(uncertain) not in client.get("/?status=PROCESSING").text.split('id="list"')[1]


def test_an_uncertain_record_shows_why_and_no_result(
    client: TestClient, uncertain: tuple[str, str, str]
) -> None:
    page = client.get(path_of(uncertain) + "?show=response")
    assert page.status_code == 200 and "UNCERTAIN" in page.text
    why = page.text.split("Why it is uncertain")[1].split("</dd>")[0]
    assert "processor says &lt;pending&gt;" in why  # the stored detail, escaped
    stored = page.text.split("Stored result")[1].split("</dd>")[0]
    assert "none" in stored and "<pre>" not in stored
    assert "Resolve…" in page.text


def test_resolve_done_after_the_confirmation_replays_the_given_result(
    client: TestClient, handler: IdempotencyHandler, population: Population,
    uncertain: tuple[str, str, str], caplog: pytest.LogCaptureFixture,
) -> None:
    tenant, operation, key = uncertain
    sign_in(client, path_of(uncertain) + "?confirm=resolve")
    confirm = client.get(path_of(uncertain) + "?confirm=resolve")
    assert "Confirm resolve" in confirm.text
    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        done = client.post(path_of(uncertain) + "/resolve", data={
            "csrf_token": csrf_of(confirm.text), "outcome": "done",
            "result": '{"refunded": 100}'})
    assert done.status_code == 200 and "Resolved: resolved as done" in done.text
    assert "dashboard:testclient" in done.text
    audit = [r for r in caplog.records if r.getMessage().startswith("uncertain_resolved")]
    assert len(audit) == 1
    fields = audit[0].idempotency  # type: ignore[attr-defined]
    assert (fields["by"], fields["resolution"], fields["key"]) == (
        "dashboard:testclient", "done", key)
    outcome = handler.run(lambda: population.runs.append("again"), operation=operation,
                          tenant=tenant, key=key)
    assert (outcome.kind, outcome.result) == ("replayed", {"refunded": 100})
    assert "doubtful" not in population.runs and "again" not in population.runs


@pytest.mark.parametrize(("outcome", "status_after", "next_kind"), [
    ("retry", None, "executed"),
    ("fail", Status.FAILED, "poisoned"),
])
def test_resolve_retry_or_fail(
    client: TestClient, handler: IdempotencyHandler, population: Population,
    uncertain: tuple[str, str, str], outcome: str, status_after: Status | None,
    next_kind: str,
) -> None:
    tenant, operation, key = uncertain
    sign_in(client)
    csrf = csrf_of(client.get("/login").text)
    done = client.post(path_of(uncertain) + "/resolve", follow_redirects=False,
                       headers={"Authorization": f"Bearer {TOKEN}"},
                       data={"csrf_token": csrf, "outcome": outcome})
    assert done.status_code == 303
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert (None if record is None else record.status) == status_after
    delivery = handler.run(lambda: "ran again", operation=operation, tenant=tenant, key=key)
    assert delivery.kind == next_kind
    assert population.runs.count("doubtful") == 0


@pytest.mark.parametrize("form", [{"outcome": "maybe"}, {"outcome": "done", "result": "{no"}])
def test_resolve_refuses_a_bad_form(client: TestClient, handler: IdempotencyHandler,
                                    uncertain: tuple[str, str, str],
                                    form: dict[str, str]) -> None:
    sign_in(client)
    form = {**form, "csrf_token": csrf_of(client.get("/login").text)}
    assert client.post(path_of(uncertain) + "/resolve", data=form).status_code == 400
    tenant, operation, key = uncertain
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert record is not None and record.status is Status.UNCERTAIN


def test_resolving_what_is_not_uncertain_is_404(client: TestClient,
                                                handler: IdempotencyHandler,
                                                population: Population) -> None:
    sign_in(client)
    csrf = csrf_of(client.get("/login").text)
    refused = client.post(path_of(population.poisoned) + "/resolve",
                          data={"csrf_token": csrf, "outcome": "retry"})
    assert refused.status_code == 404 and "no UNCERTAIN record" in refused.text
    tenant, operation, key = population.poisoned
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    assert record is not None and record.status is Status.FAILED


def test_mounted_inside_another_app(handler: IdempotencyHandler,
                                    population: Population) -> None:
    outer = Starlette(routes=[Mount("/ops/idempotency", app=create_app(handler, token=TOKEN))])
    client = TestClient(outer)
    page = client.get("/ops/idempotency/")
    assert page.status_code == 200
    assert f'href="/ops/idempotency{path_of(population.poisoned)}"' in page.text
    assert "Path=/ops/idempotency" in page.headers["set-cookie"]
    login = client.get("/ops/idempotency/login")
    done = client.post("/ops/idempotency/login", follow_redirects=False,
                       data={"csrf_token": csrf_of(login.text), "token": TOKEN})
    assert done.headers["location"] == "/ops/idempotency/"
    csrf = csrf_of(client.get("/ops/idempotency/login").text)
    unpoisoned = client.post(f"/ops/idempotency{path_of(population.poisoned)}/unpoison",
                             data={"csrf_token": csrf}, follow_redirects=False)
    assert unpoisoned.status_code == 303
    assert unpoisoned.headers["location"].startswith(f"/ops/idempotency{path_of(population.poisoned)}")
