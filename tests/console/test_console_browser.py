"""The web console in a real browser: Debian's Chromium driven by Playwright, against a real
gateway (uvicorn) and a worker, the scripted LLM and the Telegram fake. Signing in, a turn
streaming in, an approval answered and the turn finishing, a viewer refused, an agent paused
and resumed, hostile message text shown as text, a CSRF-less POST refused. Each page's
screenshot is saved under the run's logs (``console/*.png``).

Skipped, saying why, where Chromium or Playwright is not installed (`.ci/run` installs
Chromium when it can).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from tests.channels.test_channels_e2e import OWNER, TG_SECRET, post_tg, tg_update
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq, wait

pytestmark = pytest.mark.fleet
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)

TOKEN = "console-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
Page = Any  # playwright.sync_api.Page


@pytest.fixture(scope="module")
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:
        yield fake


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram
          ) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), "FERMIX_API_TOKEN": TOKEN,
           "FERMIX_TELEGRAM_BOT_TOKEN": tg.token, "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
           "FERMIX_TELEGRAM_API_BASE": tg.url, "FERMIX_TELEGRAM_BOT_USERNAME": tg.bot_username,
           "FERMIX_OWNER_IDS": f"telegram:{OWNER}",
           "FERMIX_APPROVALS__POLICIES": "[]",
           "FERMIX_APPROVALS__TOOLS": '["calculator", "run_command"]',
           # run_command in a workspace, unsandboxed on purpose (this test is about the console;
           # the sandbox has its own): the command it approves is an echo.
           "FERMIX_WORKSPACE": str(logs_dir / "console-ws"), "FERMIX_SANDBOX": "none",
           "FERMIX_AGENTS": json.dumps([{"name": "doomed"}]),
           "FERMIX_BINDINGS": json.dumps([{"agent": "doomed", "channel": "slack"}])}
    s = start_stack("console", redis_url, 13, env, logs_dir, workers=1)
    yield s
    s.stop()


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
    page = browser.new_context().new_page()
    page.goto(f"{stack.url}/console")
    assert page.url.endswith("/console/login")
    page.fill("#token", secret)
    page.click("#signin")
    page.wait_for_url(f"{stack.url}/console")
    return page


def test_a_wrong_token_is_refused_and_a_good_one_signs_in_with_an_httponly_cookie(
    browser: Any, stack: Stack, shots: Path
) -> None:
    page = browser.new_context().new_page()
    page.goto(f"{stack.url}/console/login")
    page.fill("#token", "fxt_not-a-token")
    page.click("#signin")
    assert page.text_content("#login-error") == "That token is not valid here (or it was revoked)."
    page.screenshot(path=shots / "login.png")
    page = signed_in(browser, stack, TOKEN)
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
        "fermix_session", True, "Strict")
    assert page.text_content("#who") == "api (admin)"
    # The script cannot read the session: only the CSRF token is in the page.
    assert page.evaluate("document.cookie") == ""
    # The fleet: the worker process with its slots and heartbeat, this gateway, Redis.
    (worker,) = page.locator("#workers tr[data-process]").all()
    assert worker.locator(".beat").text_content().endswith(" s ago")
    assert "master, 0 replicas" in page.text_content("#redis")
    assert page.locator("#parts th:text-is('gateway')").count() == 1
    page.screenshot(path=shots / "fleet.png")


def test_a_turn_streams_into_the_chat_view(
    browser: Any, stack: Stack, llm: ScriptedLLMServer, shots: Path
) -> None:
    page = signed_in(browser, stack, token(stack, "olga", "operator"))
    page.goto(f"{stack.url}/console/chat")
    text = uniq("stream")
    words = " ".join(f"word{i}" for i in range(12))
    llm.script.push(Reply(words, match=text, chunk_delay=0.15))
    page.fill("#message", text)
    page.click("#send")
    # Part of the reply is on the page before the run ends, then all of it.
    # (Selectors, not wait_for_function: the console's CSP refuses the eval it needs.)
    page.wait_for_selector("#live-text:not(:empty)")
    assert page.text_content("#live-status") == "running…"
    page.wait_for_selector("#live-status:text-is('done')")
    assert page.text_content("#live-text") == words
    page.screenshot(path=shots / "chat.png")
    # A conversation of the console's own channel, sent by the signed-in token.
    convs = httpx.get(f"{stack.url}/v1/conversations", params={"q": "olga-"}, headers=ADMIN,
                      timeout=10).json()["conversations"]
    assert [(c["channel"], c["conversation"].startswith("console|olga-")) for c in convs] == [
        ("console", True)]
    spent = httpx.get(f"{stack.url}/v1/usage", params={"scope": "user:console:olga"},
                      headers=ADMIN, timeout=10).json()["periods"]["day"]
    assert spent["calls"] == 1


def test_an_operator_approves_a_parked_command_and_the_turn_finishes_a_viewer_may_not(
    browser: Any, stack: Stack, llm: ScriptedLLMServer, shots: Path
) -> None:
    viewer = signed_in(browser, stack, token(stack, "vic", "viewer"))
    operator = signed_in(browser, stack, token(stack, "otto", "operator"))
    text = uniq("approve")
    llm.script.push(Reply(tool_calls=[ToolCallSpec("run_command",
                                                   {"command": "echo approved-$((6*7))"})],
                          match=text), Reply("it is 42", match=text))
    chat = uniq("ap")
    started = httpx.post(f"{stack.url}/v1/agent", json={"message": text, "chatId": chat},
                         headers=ADMIN, timeout=10).json()
    wait_until(lambda: httpx.get(f"{stack.url}/v1/approvals", headers=ADMIN).json()["approvals"],
               30, "the call parked for approval")

    viewer.goto(f"{stack.url}/console/approvals")
    viewer.click("button.answer[data-decision=approve]")
    viewer.wait_for_selector("#notice:not([hidden])")
    assert viewer.text_content("#notice") == (
        "this needs the operator role; the token 'vic' is a viewer")

    # The conversation says why it waits.
    operator.goto(f"{stack.url}/console/conversation?key=http|{chat}|root")
    assert operator.text_content("#why").startswith("Waiting for a person to approve run_command")
    operator.goto(f"{stack.url}/console/approvals")
    assert "echo approved-$((6*7))" in operator.text_content("#approvals")
    operator.screenshot(path=shots / "approvals.png")
    operator.fill("input.reason", "fine")
    operator.click("button.answer[data-decision=approve]")
    operator.wait_for_selector("td .result:text('approved by http:otto')")
    done = wait(httpx.Client(base_url=stack.url, headers=ADMIN), started["runId"])
    assert (done["status"], done["reply"]) == ("ok", "it is 42")
    # Answered: listed with who answered.
    operator.goto(f"{stack.url}/console/approvals")
    answered = operator.locator("#answered tr[data-approval]").first
    assert (answered.locator(".answer").text_content(), answered.locator(".by").text_content()
            ) == ("approved", "http:otto")

    # The run's timeline: both model calls with their tokens, cost and latency; the turn
    # parked for the approval and resumed (a second start), then the command ran.
    timeline = httpx.get(f"{stack.url}/v1/runs/{started['runId']}/timeline", headers=ADMIN
                         ).json()["entries"]
    steps = [(e["type"], e.get("name") or e.get("phase") or "") for e in timeline
             if e["type"] in ("model", "tool", "lifecycle")]
    assert steps == [("lifecycle", "start"), ("model", ""), ("lifecycle", "start"),
                     ("tool", "run_command"), ("model", ""), ("lifecycle", "end")]
    assert [e.get("resumed") for e in timeline if e["type"] == "lifecycle"][:2] == [False, True]
    model = [e for e in timeline if e["type"] == "model"]
    assert all(m["inputTokens"] > 0 and m["latencyMs"] >= 0 and m["kind"] == "turn"
               and m["model"] == "scripted-openai" for m in model)
    # The transcript links the run's timeline.
    operator.goto(f"{stack.url}/console/conversation?key=http|{chat}|root")
    operator.click("#runs summary")
    operator.click(f"#runs tr[data-run='{started['runId']}'] a")
    operator.wait_for_url(f"{stack.url}/console/run/{started['runId']}")
    assert operator.locator("#timeline tr[data-type=model]").count() == 2
    assert operator.locator("#timeline tr[data-type=tool]").count() == 1
    operator.screenshot(path=shots / "run.png")


def test_a_paused_agent_queues_a_message_until_resumed_from_the_agents_view(
    browser: Any, stack: Stack, llm: ScriptedLLMServer, shots: Path
) -> None:
    page = signed_in(browser, stack, token(stack, "paula", "operator"))
    page.goto(f"{stack.url}/console/agents")
    row = "tr[data-agent=default]"
    page.click(f"{row} button.agent-action")
    page.wait_for_selector(f"{row} .state:text('paused')")
    text = uniq("queued")
    llm.script.push(Reply("answered after resume", match=text))
    with httpx.Client(base_url=stack.url, headers=ADMIN, timeout=10) as http:
        chat = uniq("p")
        run_id = http.post("/v1/agent", json={"message": text, "chatId": chat}).json()["runId"]
        page.goto(f"{stack.url}/console/agents")
        wait_until(lambda: http.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
                   and http.get("/v1/agents").json()["agents"][0]["pending"] == 1, 30,
                   "the message queued behind the pause")
        page.reload()
        assert page.text_content(f"{row} .pending") == "1"
        # The conversation lists what waits, and why (once a worker saw the pause).
        wait_until(lambda: stack.redis().hget(keys.agents_held(), f"http|{chat}|root")
                   == "default", 30, "the message held by the pause")
        conv_page = page.context.new_page()
        conv_page.goto(f"{stack.url}/console/conversation?key=http|{chat}|root")
        assert conv_page.locator("#queued li").all_text_contents() == [text]
        assert conv_page.text_content("#why") == (
            "Waiting: the agent default is paused, so its 1 message waits (fermix agents "
            "resume default).")
        conv_page.close()
        page.screenshot(path=shots / "agents.png")
        page.click(f"{row} button.agent-action")
        page.wait_for_selector(f"{row} button.agent-action:text('Pause')")
        assert wait(http, run_id)["reply"] == "answered after resume"


def test_an_operator_stops_a_running_turn_from_its_conversation(
    browser: Any, stack: Stack, llm: ScriptedLLMServer
) -> None:
    page = signed_in(browser, stack, token(stack, "sam", "operator"))
    chat, text = uniq("stop"), uniq("long")
    llm.script.push(Reply(" ".join(f"w{i}" for i in range(40)), match=text, chunk_delay=0.5))
    with httpx.Client(base_url=stack.url, headers=ADMIN, timeout=10) as http:
        run_id = http.post("/v1/agent", json={"message": text, "chatId": chat}).json()["runId"]
        assert llm.script.wait_request(lambda q: text in json.dumps(q["body"]), 15)
        page.goto(f"{stack.url}/console/conversation?key=http|{chat}|root")
        assert page.text_content("#why").startswith("Running: held by worker console-w1@")
        # The running turn streams into the page; Stop ends it.
        page.wait_for_selector("#live-text:not(:empty)")
        page.click("button.act[data-act=stop]")
        page.wait_for_selector("#notice:not([hidden])")
        assert wait(http, run_id)["status"] == "stopped"
        assert page.text_content("#notice") == (
            "Stopped the current request and cleared 0 queued messages.")


def test_only_an_admin_may_kill_an_agent_from_the_agents_view(browser: Any, stack: Stack) -> None:
    operator = signed_in(browser, stack, token(stack, "oona", "operator"))
    operator.goto(f"{stack.url}/console/agents")
    assert operator.locator("button.agent-kill").count() == 0
    assert operator.locator("#bindings td").first.text_content() == "doomed"
    admin = signed_in(browser, stack, TOKEN)
    admin.goto(f"{stack.url}/console/agents")
    admin.on("dialog", lambda d: d.accept())
    admin.click("tr[data-agent=doomed] button.agent-kill")
    admin.wait_for_selector("tr[data-agent=doomed] .state:text-is('killed')")
    agents = httpx.get(f"{stack.url}/v1/agents", headers=ADMIN).json()["agents"]
    assert [a["state"] for a in agents if a["name"] == "doomed"] == ["killed"]


def test_hostile_text_from_telegram_renders_as_text_and_runs_nothing(
    browser: Any, stack: Stack, llm: ScriptedLLMServer, shots: Path
) -> None:
    chat = 7_000 + int(uniq("n").split("-")[1][:4], 16)
    hostile = ('<img src=x onerror="window.__xss=1"> and '
               '<script>window.__xss=2</script> ' + uniq("x"))
    llm.script.push(Reply("<b onmouseover=alert(1)>bold?</b>", match=hostile[-12:]))
    assert post_tg(stack, tg_update(chat, OWNER, hostile)).status_code == 200
    conv = f"telegram|{chat}|root"
    wait_until(lambda: _replied(stack, conv), 30, "the Telegram turn's reply in history")
    page = signed_in(browser, stack, TOKEN)
    page.goto(f"{stack.url}/console/conversation?key={conv}")
    items = page.locator("#transcript li .text").all_text_contents()
    assert items[:2] == [hostile, "<b onmouseover=alert(1)>bold?</b>"]
    assert page.evaluate("window.__xss === undefined")
    assert page.locator("#transcript img, #transcript script, #transcript b").count() == 0
    page.screenshot(path=shots / "conversation.png")
    # The list finds it by a part of its key, idle now, and filters it out by state.
    page.goto(f"{stack.url}/console/conversations")
    page.fill("#q", str(chat))
    page.click("#filter")
    page.wait_for_selector(f"tr[data-conversation='{conv}'] .state:text-is('idle')")
    assert page.text_content("#total") == "1 conversation matches."
    page.screenshot(path=shots / "conversations.png")
    page.select_option("#state", "running")
    page.click("#filter")
    page.wait_for_selector("#total:text-is('0 conversations match.')")


def _replied(stack: Stack, conv: str) -> bool:
    raw = stack.redis().lrange(f"fx:conv:{conv}:history", 0, -1)
    return len(raw) >= 2 and json.loads(raw[-1])["role"] == "assistant"


def test_the_pages_fit_a_phone(browser: Any, stack: Stack, shots: Path) -> None:
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = phone.new_page()
    page.goto(f"{stack.url}/console/login")
    page.fill("#token", TOKEN)
    page.click("#signin")
    page.wait_for_url(f"{stack.url}/console")
    for path in ("/console", "/console/conversations", "/console/approvals", "/console/agents"):
        page.goto(f"{stack.url}{path}")
        # Wide tables scroll inside themselves; the page itself never scrolls sideways.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    page.screenshot(path=shots / "phone.png")


def test_a_state_changing_request_without_the_csrf_token_is_refused(
    browser: Any, stack: Stack
) -> None:
    page = signed_in(browser, stack, TOKEN)
    status = page.evaluate("""async () => (await fetch('/v1/budgets', {method: 'PUT',
        headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({scope: 'total', period: 'day', usd: 1})})).status""")
    assert status == 403
    ok = page.evaluate("""async () => (await fetch('/v1/budgets', {method: 'PUT',
        headers: {'Content-Type': 'application/json', 'X-CSRF-Token':
                  document.querySelector('meta[name="csrf-token"]').content},
        body: JSON.stringify({scope: 'total', period: 'day', usd: 1})})).status""")
    assert ok == 200


def test_an_operator_replays_and_forks_a_run_from_its_page_a_viewer_may_not(
    browser: Any, stack: Stack, llm: ScriptedLLMServer, shots: Path
) -> None:
    text = uniq("flight")
    llm.script.push(Reply("the original says 42", match=text))
    started = httpx.post(f"{stack.url}/v1/agent", json={"message": text, "chatId": uniq("fl")},
                         headers=ADMIN, timeout=10).json()
    done = wait(httpx.Client(base_url=stack.url, headers=ADMIN), started["runId"])
    assert done["status"] == "ok"
    run_page = f"{stack.url}/console/run/{started['runId']}"

    viewer = signed_in(browser, stack, token(stack, "flight-viewer", "viewer"))
    viewer.goto(run_page)
    assert viewer.text_content("#record-size").startswith("3 entries, ")  # start, call, end
    assert viewer.locator("#replay").count() == 0 and viewer.locator("#fork").count() == 0

    operator = signed_in(browser, stack, token(stack, "flight-operator", "operator"))
    operator.goto(run_page)
    called = len(llm.script.requests)
    operator.click("#replay")
    operator.wait_for_selector("#replay-result:text('Reproduced')")
    assert operator.text_content("#replay-result") == (
        "  1  model  model replies (20 characters)\n"
        "Reproduced: the same tool calls and the same reply.")
    assert len(llm.script.requests) == called  # no model was called

    llm.script.push(Reply("the fork says 42 too", match=text))
    operator.fill("#fork-model", "scripted-b")
    operator.click("#fork button")
    operator.wait_for_selector("#fork-result:not([hidden])")
    assert operator.text_content("#fork-result .o-reply") == "the original says 42"
    assert operator.text_content("#fork-result .f-reply") == "the fork says 42 too"
    assert operator.text_content("#fork-result .f-run").endswith("(model openai/scripted-b)")
    assert llm.script.requests[-1]["body"]["model"] == "scripted-b"
    operator.screenshot(path=shots / "run-fork.png")
