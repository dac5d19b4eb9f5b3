"""The dashboard in a real browser: Debian's Chromium driven by Playwright against a real
uvicorn server over a real store (a SQLite file, and PostgreSQL under a table prefix of its
own), with records in every state.

Under ``CI=true`` a missing Chromium or Playwright is a failure, never a skip.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from idempotent_tasks import IdempotencyHandler, Status
from idempotent_tasks.dashboard import create_app
from idempotent_tasks.testing import FakeClock

from .._services import IN_CI
from ..conftest import drop_store, make_store
from ._server import serve
from .conftest import LEASE, TOKEN, UNCERTAIN_DETAIL, Population, park_uncertain, populate

CHROMIUM = os.environ.get("IDEMPOTENT_TASKS_CHROMIUM", "/usr/bin/chromium")
#: Where ``make docs-screenshots`` asks this suite to save its screenshots.
SCREENSHOTS_ENV = "IDEMPOTENT_TASKS_SCREENSHOTS"
#: Milliseconds Playwright waits for a page or an element (generous: a loaded 2-core box).
BUDGET_MS = 60_000


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message + " (CI=true: the browser tests never skip)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if executable is None:
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                              args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Served:
    def __init__(self, url: str, handler: IdempotencyHandler, population: Population,
                 store: Any) -> None:
        self.url = url
        self.handler = handler
        self.population = population
        self.store = store

    def record_url(self, scope: tuple[str, str, str]) -> str:
        return self.url + "/records/" + "/".join(quote(part, safe="") for part in scope)


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    store = make_store(request.param, tmp_path)
    clock = FakeClock(start=time.time() - 600)  # recent timestamps; moves only when told
    handler = IdempotencyHandler(store, clock=clock, metrics=None, lease_timeout=LEASE)
    try:
        population = populate(handler, clock)
        with serve(create_app(handler, token=TOKEN)) as url:
            yield Served(url, handler, population, store)
    finally:
        handler.close()
        drop_store(store)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    context.set_default_timeout(BUDGET_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def _rows(page: Any) -> str:
    text: str = page.locator("#list ~ table").inner_text()
    return text


def test_pages_render_and_filters_work(page: Any, served: Served) -> None:
    pop = served.population
    page.goto(served.url + "/")
    assert page.get_by_role("heading", name="Records").is_visible()
    counts = page.locator("table").first.inner_text()
    for status in Status:
        assert status.value in counts
    stuck = page.locator("#stuck ~ table").first.inner_text()
    assert pop.stuck[2] in stuck and pop.live[2] not in stuck

    page.get_by_label("Status").select_option("FAILED")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/?status=FAILED*")
    listed = _rows(page)
    assert pop.poisoned[2] in listed and pop.executed[2] not in listed

    page.get_by_label("Status").select_option("")
    page.get_by_label("Tenant").fill("globex")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**tenant=globex*")
    listed = _rows(page)
    assert pop.stuck[2] in listed and pop.live[2] in listed and pop.poisoned[2] not in listed

    page.get_by_role("link", name=pop.stuck[2]).first.click()
    page.wait_for_url(served.record_url(pop.stuck))
    body = page.locator("main").inner_text()
    assert "PROCESSING" in body and "stuck: expired" in body and "Fencing token" in body


def start_action_signing_in(page: Any, action: str) -> None:
    """On a record's page: the action's link, the sign-in it leads to, back at its
    confirmation step."""
    page.get_by_role("link", name=f"{action.capitalize()}…").click()
    page.get_by_role("link", name="Sign in with the operator token").click()
    page.get_by_label("Operator token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**confirm={action}")


def test_unpoison_from_the_page_lets_the_next_delivery_run(page: Any, served: Served) -> None:
    tenant, operation, key = served.population.poisoned
    page.goto(served.record_url(served.population.poisoned))
    assert "FAILED" in page.locator("main").inner_text()
    start_action_signing_in(page, "unpoison")
    page.get_by_role("button", name="Confirm unpoison").click()
    page.wait_for_url("**done=unpoison")
    main = page.locator("main").inner_text()
    assert "Unpoisoned" in main and "dashboard:127.0.0.1" in main

    ran: list[str] = []
    outcome = served.handler.run(lambda: ran.append("again") or "charged again",
                                 operation=operation, tenant=tenant, key=key)
    assert outcome.kind == "executed" and ran == ["again"]


def test_a_request_without_the_token_or_the_csrf_token_is_refused(page: Any,
                                                                  served: Served) -> None:
    tenant, operation, key = served.population.poisoned
    action = served.record_url(served.population.poisoned) + "/unpoison"
    page.goto(served.url + "/login")
    csrf = page.locator("input[name=csrf_token]").get_attribute("value")
    assert page.request.post(action, form={"csrf_token": csrf}).status == 401

    page.get_by_label("Operator token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(served.url + "/")
    assert page.request.post(action, form={}).status == 403            # a forged form
    assert page.request.post(action, form={"csrf_token": "forged"}).status == 403

    record = served.handler.get_record(operation=operation, tenant=tenant, key=key)
    assert record is not None and record.status is Status.FAILED


def test_screenshots_of_the_main_pages(page: Any, served: Served, tmp_path: Path) -> None:
    """The index and a record's page as images (``make docs-screenshots`` keeps them)."""
    target = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    shots = {"dashboard-index.png": served.url + "/",
             "dashboard-record.png": served.record_url(served.population.poisoned)}
    for name, url in shots.items():
        page.goto(url)
        path = target / name
        page.screenshot(path=str(path), full_page=True)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("served", ["memory", "sqlite", "postgres"], indirect=True)
def test_resolve_an_uncertain_record_from_the_page(page: Any, served: Served) -> None:
    """An operator finds the UNCERTAIN record on the index, reads why on its page, signs
    in and resolves it as done with a result, which the next delivery gets replayed."""
    scope = park_uncertain(served.handler, served.population)
    tenant, operation, key = scope
    page.goto(served.url + "/")
    assert key in page.locator("#uncertain ~ table").first.inner_text()
    page.get_by_role("link", name=key).first.click()
    page.wait_for_url(served.record_url(scope))
    main = page.locator("main").inner_text()
    assert "UNCERTAIN" in main and UNCERTAIN_DETAIL in main
    start_action_signing_in(page, "resolve")
    page.get_by_role("radio", name="done — record it as SUCCESS").check()
    page.get_by_role("textbox", name="Result (JSON)").fill('{"refunded": 100}')
    page.get_by_role("button", name="Confirm resolve").click()
    page.wait_for_url("**done=resolve")
    main = page.locator("main").inner_text()
    assert "resolved as done" in main and "dashboard:127.0.0.1" in main
    assert "UNCERTAIN" not in page.locator("dl.fields").inner_text()

    outcome = served.handler.run(lambda: "refunded twice", operation=operation,
                                 tenant=tenant, key=key)
    assert (outcome.kind, outcome.result) == ("replayed", {"refunded": 100})
