"""The console's audit and usage views in a real browser (Debian's Chromium driven by
Playwright) against a real gateway (uvicorn, no worker: the usage is recorded into Redis as a
worker's model calls would be). The audit trail listed and filtered by kind, its chain
verified; a scope's spending charted, today's spenders and a budget's bar; an admin sets and
clears a budget from the page; a viewer sees no form and the API refuses the viewer's PUT.
Screenshots go under the run's logs (``console/audit.png``, ``console/usage.png``).

Skipped, saying why, where Chromium or Playwright is not installed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared.usage import store
from tests.conftest import Stack, provider_env, start_stack

pytestmark = pytest.mark.fleet
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)

TOKEN = "consoleops-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
DAY_S = 86_400
CONV = "conversation:http|ops-chat|root"
Page = Any  # playwright.sync_api.Page


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_API_TOKEN": TOKEN}
    s = start_stack("consoleops", redis_url, 12, env, logs_dir, workers=0)
    _seed_usage(s)
    yield s
    s.stop()


def _seed_usage(s: Stack) -> None:
    """A week of model calls: the default agent every day (more each day), ``ops`` today."""
    r, now = s.redis(), time.time()
    for days_ago in range(7):
        cost = (7 - days_ago) * 10_000  # $0.01 a week ago .. $0.07 today
        store.record(r, ["total", "agent:default", CONV, "user:http:ops-chat"], 1_000, 200,
                     cost, "", now - days_ago * DAY_S)
    store.record(r, ["total", "agent:ops", "user:telegram:42"], 4_000, 800, 90_000, "", now)
    r.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(logs_dir: Path) -> Path:
    d = logs_dir / "console"
    d.mkdir(exist_ok=True)
    return d


def token(stack: Stack, name: str, role: str) -> str:
    resp = httpx.post(f"{stack.url}/v1/tokens", json={"name": name, "role": role},
                      headers=ADMIN, timeout=10)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["token"])


def signed_in(browser: Any, stack: Stack, secret: str) -> Page:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(f"{stack.url}/console/login")
    page.fill("#token", secret)
    page.click("#signin")
    page.wait_for_url(f"{stack.url}/console")
    return page


def test_the_audit_view_lists_filters_by_kind_and_verifies_the_chain(
    browser: Any, stack: Stack, shots: Path
) -> None:
    vera = {"Authorization": f"Bearer {token(stack, 'vera', 'viewer')}"}  # admin entries
    token(stack, "otis", "operator")
    budget = {"scope": "total", "period": "day", "usd": 1}
    assert httpx.put(f"{stack.url}/v1/budgets", json=budget, headers=ADMIN,
                     timeout=10).status_code == 200
    assert httpx.put(f"{stack.url}/v1/budgets", json=budget, headers=vera,  # a check, failed
                     timeout=10).status_code == 403
    page = signed_in(browser, stack, TOKEN)
    page.click("header nav a:text-is('Audit')")
    page.wait_for_url(f"{stack.url}/console/audit")
    kinds = page.locator("#audit tr[data-kind]").evaluate_all("rows => rows.map(r => r.dataset.kind)")
    assert {"admin", "check"} <= set(kinds)
    assert page.locator("#audit tr[data-kind] td.kind").first.text_content() == kinds[0]
    # Newest first: the sign-in (a check) came after the tokens were made.
    seqs = [int(s) for s in page.locator("#audit tr[data-seq]").evaluate_all(
        "rows => rows.map(r => r.dataset.seq)")]
    assert seqs == sorted(seqs, reverse=True)
    assert kinds[0] == "check"
    assert page.locator("#audit tr.outcome-fail td:text-is('role')").count() == 1
    page.click("#verify")
    page.wait_for_selector("#verify-result[data-ok=yes]")
    checked = httpx.get(f"{stack.url}/v1/audit/verify", headers=ADMIN, timeout=10).json()
    assert checked["ok"] and checked["checked"] >= len(seqs)
    assert page.text_content("#verify-result") == f"Chain OK: {checked['checked']} entries checked."
    page.screenshot(path=shots / "audit.png", full_page=True)

    page.select_option("#f-kind", "admin")
    page.click("#filter")
    page.wait_for_url("**/console/audit?*kind=admin*")
    rows = page.locator("#audit tr[data-kind]")
    assert rows.count() >= 2
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.kind)")) == {"admin"}
    assert "token.create" in page.text_content("#audit")
    assert "token=otis" in page.text_content("#audit")
    assert page.locator("#audit td:text-is('budget.set')").count() == 1


def test_the_usage_view_charts_the_spending_and_shows_a_budget_bar(
    browser: Any, stack: Stack, shots: Path
) -> None:
    set_ = httpx.put(f"{stack.url}/v1/budgets", headers=ADMIN, timeout=10,
                     json={"scope": "agent:default", "period": "day", "usd": 0.28})
    assert set_.status_code == 200, set_.text
    page = signed_in(browser, stack, TOKEN)
    page.goto(f"{stack.url}/console/usage?scope=agent:default&by=day")
    assert page.text_content("#chart-scope") == "agent:default"
    assert page.text_content("#chart-total") == "$0.28"  # 1+2+...+7 cents
    bars = page.locator("#chart .bar")
    assert bars.count() == 30
    newest = bars.last
    assert newest.get_attribute("data-value") == "$0.07"
    assert newest.get_attribute("data-pct") == "100.0"
    # The script sized the bars (the CSP allows no style in the page itself).
    assert newest.evaluate("el => el.style.height") == "100%"
    assert bars.nth(23).evaluate("el => el.style.height") == "14.3%"  # $0.01 of $0.07
    assert bars.first.evaluate("el => el.style.height") == "0%"
    # Today: the costliest agent first.
    today = page.locator("#today-agent tr[data-scope]")
    assert today.evaluate_all("rows => rows.map(r => r.dataset.scope)") == [
        "agent:ops", "agent:default"]
    assert page.text_content("#today-agent tr[data-scope='agent:ops'] .spend") == "$0.09"
    assert page.locator(f"#today-conversation tr[data-scope='{CONV}']").count() == 1
    # The budget: $0.07 of $0.28 today, a quarter.
    row = page.locator("#budgets tr[data-scope='agent:default'][data-period=day]")
    assert row.locator("progress").get_attribute("value") == "25.0"
    assert row.locator(".amounts").text_content() == "$0.07 of $0.28"
    page.screenshot(path=shots / "usage.png", full_page=True)

    # A conversation's own chart, from its link.
    page.click(f"#today-conversation tr[data-scope='{CONV}'] a")
    page.wait_for_selector(f"#chart-scope:text-is('{CONV}')")
    assert page.text_content("#chart-total") == "$0.28"


def test_an_admin_sets_and_clears_a_budget_from_the_usage_view(
    browser: Any, stack: Stack
) -> None:
    page = signed_in(browser, stack, TOKEN)
    page.goto(f"{stack.url}/console/usage")
    page.fill("#b-scope", "agent:ops")
    page.select_option("#b-period", "month")
    page.fill("#b-usd", "0.36")
    page.click("#budget-save")
    row = "#budgets tr[data-scope='agent:ops'][data-period=month]"
    page.wait_for_selector(row)
    assert page.locator(f"{row} progress").get_attribute("value") == "25.0"
    listed = httpx.get(f"{stack.url}/v1/budgets", headers=ADMIN, timeout=10).json()["budgets"]
    (ops,) = [b for b in listed if b["scope"] == "agent:ops"]
    assert (ops["period"], ops["limit"]["usd"], ops["setBy"]) == ("month", 0.36, "api")

    page.click(f"{row} button.budget-clear")
    page.wait_for_selector(row, state="detached")
    assert page.text_content("#notice") == "Cleared the month budget on agent:ops."
    listed = httpx.get(f"{stack.url}/v1/budgets", headers=ADMIN, timeout=10).json()["budgets"]
    assert not [b for b in listed if b["scope"] == "agent:ops"]
    # A refused budget says why, on the page.
    page.fill("#b-scope", "agent:Not An Agent")
    page.fill("#b-usd", "1")
    page.click("#budget-save")
    page.wait_for_selector("#notice:text('scope: not an agent name')")


def test_a_viewer_reads_the_usage_view_but_may_not_change_a_budget(
    browser: Any, stack: Stack
) -> None:
    page = signed_in(browser, stack, token(stack, "vince", "viewer"))
    page.goto(f"{stack.url}/console/usage")
    assert page.locator("#budgets tr[data-scope='agent:default']").count() == 1
    assert page.locator("#budget-set").count() == 0
    assert page.locator("button.budget-clear").count() == 0
    assert "an admin sets and clears them" in page.text_content("main")
    status = page.evaluate("""async () => (await fetch('/v1/budgets', {method: 'PUT',
        headers: {'Content-Type': 'application/json', 'X-CSRF-Token':
                  document.querySelector('meta[name="csrf-token"]').content},
        body: JSON.stringify({scope: 'total', period: 'day', usd: 1})})).status""")
    assert status == 403
    page.goto(f"{stack.url}/console/audit?kind=check")
    page.click("#verify")
    page.wait_for_selector("#verify-result[data-ok=yes]")
    assert "role" in page.text_content("#audit")  # the refused PUT, audited
