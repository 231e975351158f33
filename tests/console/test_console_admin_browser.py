"""The console's scheduled jobs and skills views in a real browser (Debian's Chromium driven by
Playwright) against a real gateway (uvicorn, no worker: nothing fires or runs; the jobs are made
with the store as ``fermix schedule add`` makes them). A job listed with its next and last
run; an operator pauses and resumes it from the page and runs it now from its history page;
an admin deletes one; the skills with their trust and root and the files not loaded; an admin
reloads the registry and the page says so; a viewer sees no buttons and the API refuses the
viewer anyway. Screenshots go under the run's logs (``console/schedules.png``,
``console/skills.png``).

Skipped, saying why, where Chromium or Playwright is not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared import keys
from fermix_shared.scheduling.jobs import Job, JobRun, Schedule
from fermix_shared.scheduling.store import JobStore
from tests.conftest import Stack, provider_env, start_stack

pytestmark = pytest.mark.fleet
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)

TOKEN = "consoleadmin-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
Page = Any  # playwright.sync_api.Page
NIGHTLY = "tr[data-job='nightly-report']"


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    home = logs_dir / "consoleadmin"
    for folder, name, text in (
        (home / "skills", "half-done", "no frontmatter yet\n"),
        (home / "skills", "release-notes",
         "---\nname: release-notes\ndescription: Draft release notes from merged PRs.\n---\n"
         "List the merged PRs, group them, write the notes.\n"),
        (home / "plugins" / "weather" / "skills", "forecast",
         "---\nname: forecast\ndescription: Tomorrow's forecast for a city.\n---\n"
         "Ask the weather tool.\n"),
    ):
        (folder / name).mkdir(parents=True)
        (folder / name / "SKILL.md").write_text(text, encoding="utf-8")
    env = {**provider_env(llm, "openai"), "FERMIX_API_TOKEN": TOKEN}
    s = start_stack("consoleadmin", redis_url, 14, env, logs_dir, workers=0)
    _seed_jobs(s)
    yield s
    s.stop()


def _seed_jobs(s: Stack) -> None:
    """A nightly job with two runs behind it (the newest an error), an hourly one."""
    r = s.redis()
    store = JobStore(r)
    store.add(Job(name="nightly-report", message="Summarise yesterday's tickets.",
                  schedule=Schedule(kind="cron", cron="0 3 * * *", tz="Europe/Berlin")))
    for i, status in enumerate(("ok", "error")):
        run = JobRun(run_id=f"run_nightly_{i}", status=status, trigger="schedule",
                     started_at=1_767_236_400_000 + i * 86_400_000,
                     ended_at=1_767_236_412_000 + i * 86_400_000,
                     output="12 tickets, 3 open." if status == "ok" else "provider timeout",
                     input_tokens=900, output_tokens=120)
        store.update("nightly-report", lambda j, t=run.ended_at: j.model_copy(
            update={"last_run_at": t}), run=run)
    store.add(Job(name="hourly-check", message="Check the queue depth.",
                  schedule=Schedule(kind="every", every_s=3600)))
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


def job(stack: Stack, name: str) -> dict[str, Any]:
    resp = httpx.get(f"{stack.url}/v1/schedules/{name}", headers=ADMIN, timeout=10)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_a_job_is_listed_and_an_operator_pauses_resumes_and_runs_it(
    browser: Any, stack: Stack, shots: Path
) -> None:
    nightly = job(stack, "nightly-report")
    admin = signed_in(browser, stack, TOKEN)
    admin.click("header nav a:text-is('Schedules')")
    admin.wait_for_url(f"{stack.url}/console/schedules")
    names = admin.locator("#schedules tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")
    assert names == ["hourly-check", "nightly-report"]
    assert admin.text_content(f"{NIGHTLY} .next-run") == utc(nightly["nextRunAt"])
    assert admin.text_content(f"{NIGHTLY} .state") == "active"
    assert admin.text_content(f"{NIGHTLY} .last-run .status") == "error"
    assert admin.locator(f"{NIGHTLY} button[data-action=delete]").count() == 1
    admin.screenshot(path=shots / "schedules.png", full_page=True)

    page = signed_in(browser, stack, token(stack, "otis", "operator"))
    page.goto(f"{stack.url}/console/schedules")
    assert page.locator("button[data-action=delete]").count() == 0  # an admin's
    page.click(f"{NIGHTLY} button[data-action=pause]")
    page.wait_for_selector(f"{NIGHTLY}[data-state=paused]")
    assert page.text_content(f"{NIGHTLY} .next-run") == "-"
    assert page.text_content("#notice") == "Paused job 'nightly-report'."
    assert job(stack, "nightly-report")["state"] == "paused"
    page.click(f"{NIGHTLY} button[data-action=resume]")
    page.wait_for_selector(f"{NIGHTLY}[data-state=active]")
    resumed = job(stack, "nightly-report")
    assert (resumed["state"], resumed["nextRunAt"]) == ("active", nightly["nextRunAt"])
    assert page.text_content(f"{NIGHTLY} .next-run") == utc(resumed["nextRunAt"])
    assert page.text_content(f"{NIGHTLY} button[data-action=pause]") == "Pause"

    # Its history page, and a run now from there.
    page.click(f"{NIGHTLY} a")
    page.wait_for_url(f"{stack.url}/console/schedules/nightly-report")
    assert page.locator("#runs tr[data-run]").evaluate_all(
        "rows => rows.map(r => r.dataset.status)") == ["error", "ok"]
    assert page.text_content("#job-message") == "Summarise yesterday's tickets."
    page.click("#job button[data-action=run]")
    page.wait_for_selector("#notice:text('Started a run of job')")
    run_id = page.text_content("#notice").rsplit(": ", 1)[1]
    run = httpx.get(f"{stack.url}/v1/runs/{run_id}", headers=ADMIN, timeout=10).json()
    assert run["status"] == "queued"  # no worker here
    recent = httpx.get(f"{stack.url}/v1/audit/recent", headers=ADMIN, timeout=10).json()
    done = [(e["action"], e["actor"]) for e in recent["entries"]
            if e["action"].startswith("schedule.")]
    assert done == [("schedule.run_now", "http:otis"), ("schedule.resume", "http:otis"),
                    ("schedule.pause", "http:otis")]


def test_an_admin_deletes_a_job_from_the_list(browser: Any, stack: Stack) -> None:
    page = signed_in(browser, stack, TOKEN)
    page.goto(f"{stack.url}/console/schedules")
    page.once("dialog", lambda d: d.accept())
    page.click("tr[data-job='hourly-check'] button[data-action=delete]")
    page.wait_for_selector("tr[data-job='hourly-check']", state="detached")
    assert page.text_content("#notice") == "Deleted job 'hourly-check'."
    assert httpx.get(f"{stack.url}/v1/schedules/hourly-check", headers=ADMIN,
                     timeout=10).status_code == 404


def test_the_skills_page_lists_skills_with_trust_and_an_admin_reloads(
    browser: Any, stack: Stack, shots: Path
) -> None:
    page = signed_in(browser, stack, TOKEN)
    page.click("header nav a:text-is('Skills')")
    page.wait_for_url(f"{stack.url}/console/skills")
    row = "#skills tr[data-skill='write-a-skill']"
    assert page.text_content(f"{row} .trust") == "operator"
    assert page.text_content(f"{row} .root") == "bundled"
    assert page.text_content("#skills tr[data-skill='forecast'] .trust") == "guest"
    assert page.text_content("#skills tr[data-skill='release-notes'] .root") == "home"
    issue = page.locator("#skill-issues tr[data-source$='half-done/SKILL.md']")
    assert issue.count() == 1 and issue.locator(".error").text_content()
    before = page.text_content("#skills-version")
    page.screenshot(path=shots / "skills.png", full_page=True)

    page.click("#skills-reload")
    page.wait_for_selector("#notice:text('every worker rescans its skills')")
    version = str(int(before or "0") + 1)
    assert page.text_content("#notice").startswith(f"Skill registry version {version}:")
    assert page.text_content("#skills-version") == version
    r = stack.redis()
    assert r.get(keys.skills_version()) == version
    r.close()
    recent = httpx.get(f"{stack.url}/v1/audit/recent", headers=ADMIN, timeout=10).json()
    assert [(e["actor"], e["detail"]["version"]) for e in recent["entries"]
            if e["action"] == "skill.reload"] == [("http:api", version)]


def test_a_viewer_sees_no_buttons_and_may_not_act(browser: Any, stack: Stack) -> None:
    page = signed_in(browser, stack, token(stack, "vince", "viewer"))
    page.goto(f"{stack.url}/console/schedules")
    assert page.locator(NIGHTLY).count() == 1
    assert page.locator("button.job-action").count() == 0
    assert "an operator pauses, resumes and runs them" in page.text_content("main")
    status = page.evaluate("""async () => (await fetch('/v1/schedules/nightly-report/pause', {
        method: 'POST', headers: {'X-CSRF-Token':
            document.querySelector('meta[name="csrf-token"]').content}})).status""")
    assert status == 403
    page.goto(f"{stack.url}/console/schedules/nightly-report")
    assert page.locator("button.job-action").count() == 0
    page.goto(f"{stack.url}/console/skills")
    assert page.locator("#skills tr[data-skill='write-a-skill']").count() == 1
    assert page.locator("#skills-reload").count() == 0
    assert "An admin reloads the registry." in page.text_content("main")
