"""Owners' budget alerts across real processes (gateway, a worker, the scripted LLM's reported
tokens, the fake Telegram, a webhook receiver on 127.0.0.1 that checks the HMAC and fails its
first request): one message into the owners' chat and one signed webhook POST at the warning
and at the cap, the failed POST retried; with ``pause_at_cap`` the agent is paused at its cap,
its next message waits, and an owner's resume (after raising the budget) lets it run."""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Usage
from fermix_shared import keys
from fermix_shared.audit.store import AuditLog
from fermix_worker.usage.alerts import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import post, uniq, wait
from tests.worker.usage.test_budget_fleet import answer, run

PRICES = {"scripted-openai": {"input": 1000, "output": 2000}}  # $0.001 / $0.002 a token
SECRET = "alert-s3cret"
OWNER_CHAT = 777001


@dataclass(frozen=True)
class Received:
    status: int
    signed: bool
    body: dict[str, Any]


class WebhookReceiver:
    """An alert webhook on 127.0.0.1: checks each POST's signature, answers 500 to the first
    one and 200 after, and keeps what it received."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (stdlib name)
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                ts = self.headers.get(TIMESTAMP_HEADER, "")
                signed = hmac.compare_digest(self.headers.get(SIGNATURE_HEADER, ""),
                                             signature(SECRET, ts, raw))
                with receiver._lock:
                    status = 500 if not receiver.received else (200 if signed else 401)
                    receiver.received.append(Received(status, signed, json.loads(raw)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/alerts"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def delivered(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.body for r in self.received if r.status == 200]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def hook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path, tg: FakeTelegram,
          hook: WebhookReceiver) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"), **tg.gateway_env("tg-secret", 42),
           "FERMIX_PRICES": json.dumps(PRICES), "FERMIX_MAX_TOKENS": "100",
           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "0",
           "FERMIX_AGENTS": json.dumps([{"name": "ops"}]),
           "FERMIX_USAGE__ALERT_CHAT": f"telegram:{OWNER_CHAT}",
           "FERMIX_USAGE__ALERT_WEBHOOK": hook.url, "FERMIX_USAGE__ALERT_SECRET": SECRET,
           "FERMIX_USAGE__ALERT_RETRY_SECONDS": "0.2", "FERMIX_USAGE__PAUSE_AT_CAP": "true"}
    s = start_stack("alerts", redis_url, 9, env, logs_dir)
    yield s
    s.stop()


def owner_chat(tg: FakeTelegram) -> list[str]:
    return [m.text for m in tg.chat(OWNER_CHAT)]


def test_owners_are_alerted_once_at_the_warning_and_at_the_cap_which_pauses_the_agent(
    stack: Stack, llm: ScriptedLLMServer, tg: FakeTelegram, hook: WebhookReceiver
) -> None:
    chat = uniq("alerts")
    one, two, three = uniq("one"), uniq("two"), uniq("three")
    answer(llm, one, "first answer", Usage(17_000, 8_000))  # $33.00
    answer(llm, two, "second answer", Usage(3_000, 2_000))  # $7.00
    answer(llm, three, "third answer", Usage(10, 10))
    warn = ("Budget alert: 82% of the daily budget of agent:ops is used ($33.00 of $40.00); "
            "it resets at 00:00 UTC.")
    cap = ("Budget reached: the daily budget of agent:ops is used up ($40.00 of $40.00); its "
           "requests are refused until it resets at 00:00 UTC. The agent ops is paused until "
           "an owner resumes it (fermix agents resume ops).")
    with stack.http() as http:
        assert http.put("/v1/budgets", json={"scope": "agent:ops", "period": "day",
                                             "usd": 40}).status_code == 200
        assert run(http, one, chat, agent="ops")["reply"] == "first answer"
        wait_until(lambda: owner_chat(tg) == [warn], 30, "the warning in the owners' chat")
        wait_until(lambda: len(hook.delivered()) == 1, 30, "the warning's webhook, retried")

        assert run(http, two, chat, agent="ops")["reply"] == "second answer"
        wait_until(lambda: owner_chat(tg) == [warn, cap], 30, "the cap in the owners' chat")
        wait_until(lambda: len(hook.delivered()) == 2, 30, "the cap's webhook")

        def state() -> str:
            (ops,) = [a for a in http.get("/v1/agents").json()["agents"] if a["name"] == "ops"]
            return str(ops["state"])

        assert state() == "paused"
        # Paused: the next message is accepted and waits.
        waiting = post(http, three, chat, agent="ops")
        assert waiting.status_code == 202
        run_id = waiting.json()["runId"]
        r = stack.redis()
        wait_until(lambda: r.hget(keys.agents_held(), f"http|{chat}|root") == "ops", 30,
                   "the message held by the pause")
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "queued"

        # An owner raises the budget and resumes the agent: the message runs.
        assert http.put("/v1/budgets", json={"scope": "agent:ops", "period": "day",
                                             "usd": 100}).status_code == 200
        assert http.post("/v1/agents/ops/resume").json()["released"] == 1
        assert wait(http, run_id)["reply"] == "third answer"
        assert state() != "paused"

    # One message and one delivered POST per threshold; the first POST (the warning) failed
    # and was sent again with the same id, every one signed.
    assert owner_chat(tg) == [warn, cap]
    received = list(hook.received)
    assert [(r.status, r.body["event"]) for r in received] == [
        (500, "budget.warn"), (200, "budget.warn"), (200, "budget.cap")]
    assert all(r.signed for r in received) and received[0].body["id"] == received[1].body["id"]
    warned, capped = received[1].body, received[2].body
    assert (warned["scope"], warned["period"], warned["percent"], warned["text"]) == (
        "agent:ops", "day", 82.5, warn)
    assert (capped["reached"], capped["pausedAgent"], capped["text"]) == (True, "ops", cap)
    (paused,) = [e for e in AuditLog(stack.redis()).recent(agent="ops")
                 if e.action == "agent.pause"]
    assert (paused.actor, paused.detail["reason"]) == ("budget", "budget cap")
