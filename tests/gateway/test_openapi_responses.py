"""The served schema describes the real responses (issue 32 item 7: a typed API).

The gateway in this process (TestClient, a private Redis database), seeded through its own
API and stores so that the list and get routes answer non-empty bodies: a command's run (with
its timeline and transcript), a queued message, a named token, a budget, usage, a paused agent,
an approval, a scheduled job with a run, skills on disk, a worker's heartbeat and sandbox.

- Every ``/v1`` operation of ``/openapi.json`` declares a 2xx body with a schema (a route
  without its ``response_model`` fails here), and every error it declares is the app's
  ``{"error"}`` or OpenAI's, never FastAPI's ``{"detail": [...]}``.
- Every ``/v1`` GET, and a dozen writes, called with the seeded ids: each answer's status is
  one its operation declares and its body conforms to that status's schema (schemathesis'
  ``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``).
- Every GET again with a few generated requests (unknown ids, odd queries): the refusals
  conform too. A handful of examples each, so this stays a few seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.core import NotSet
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fermix_gateway.app import create_app
from fermix_shared import keys
from fermix_shared.agents.definitions import AgentDefinition
from fermix_shared.approvals import store as approvals
from fermix_shared.approvals.store import ApprovalRequest
from fermix_shared.hooks import HookRegistry
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.scheduling.jobs import Job, JobRun, Schedule
from fermix_shared.scheduling.store import JobStore
from fermix_shared.settings import Settings
from fermix_shared.stores import history, sandbox
from fermix_shared.stores.sandbox import SandboxReport
from fermix_shared.stores.timeline import ModelCall, record_call
from fermix_shared.usage import store as usage
from tests.gateway.inprocess import RecordingCelery

TOKEN = "openapi-admin-t0k"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
AGENTS = [AgentDefinition(name="ops", provider="openai", model="gpt-4.1-mini"),
          AgentDefinition(name="helper", role="sub")]
WORKER = "host-a:11:w"


class Served:
    """The seeded gateway: its client, the schema it serves, the ids it holds."""

    def __init__(self, client: TestClient, r: redis.Redis) -> None:
        self.client, self.r = client, r
        self.raw: dict[str, Any] = client.get("/openapi.json").json()
        self.schema = schemathesis.openapi.from_dict(self.raw)
        self.ids: dict[str, str] = {}

    def call(self, method: str, path: str, expect: int, *, path_parameters: dict[str, str]
             | None = None, query: dict[str, Any] | None = None, body: Any = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        """One request as the operation's case; its answer is ``expect`` and conforms."""
        media = {} if body is None else {"body": body, "media_type": "application/json"}
        case = self.schema[path][method].Case(path_parameters=path_parameters or {},
                                              query=query, **media)
        resp = self.request(case, headers or ADMIN)
        assert resp.status_code == expect, (method, path, resp.status_code, resp.text[:500])
        case.validate_response(resp, checks=CHECKS)
        return resp

    def request(self, case: Any, headers: dict[str, str]) -> httpx.Response:
        sent: dict[str, Any] = {"params": case.query, "headers": {**(case.headers or {}),
                                                                  **headers}}
        if not isinstance(case.body, NotSet):
            sent["json"] = case.body
        return self.client.request(case.method, case.formatted_path, **sent)


def seed(s: Served) -> None:
    """Something for every list and get route to show."""
    r, now = s.r, time.time()
    made = s.call("POST", "/v1/tokens", 201, body={"name": "ops-1", "role": "operator"})
    s.ids["operator"] = made.json()["token"]
    s.call("PUT", "/v1/budgets", 200, body={"scope": "agent:default", "period": "day", "usd": 5})
    s.call("POST", "/v1/agents/{name}/pause", 200, path_parameters={"name": "ops"})
    queued = s.call("POST", "/v1/agent", 202, body={"message": "hello", "chatId": "c1"})
    s.ids["queued"] = queued.json()["runId"]
    # A command is answered at once: a run that has ended, with its events.
    done = s.call("POST", "/v1/agent", 202, body={"message": "/help", "chatId": "c2"})
    run = s.ids["run"] = done.json()["runId"]
    record_call(r, run, ModelCall(at_ms=int(now * 1000), latency_ms=120, kind="turn",
                                  model="openai/gpt-4.1-mini", input_tokens=10, output_tokens=3))
    history.append(r, "http|c2|root", [
        ChatMessage(role="user", content="/help"),
        ChatMessage(role="assistant", content="", tool_calls=[ToolCall(id="call_1", name="t")]),
        ChatMessage(role="tool", content="boom", tool_name="t", is_error=True),
        ChatMessage(role="assistant", content="Done.")])
    usage.record(r, ["total", "agent:default"], 100, 20, 1500, "", now, cache_read=10)
    approvals.ask(r, ApprovalRequest(
        approval_id="a0000001", conv="http|c1|root", run_id=s.ids["queued"], call_id="call_1",
        tool="run_command", arguments={"command": "ls"}, requested_at=now, expires_at=now + 600))
    approvals.ask(r, ApprovalRequest(
        approval_id="a0000002", conv="http|c9|root", run_id="run_9", call_id="call_2",
        tool="run_command", requested_at=now, expires_at=now + 600))
    store = JobStore(r)
    store.add(Job(name="report", schedule=Schedule(kind="every", every_s=3600),
                  message="the report"))
    store.update("report", lambda j: j.model_copy(update={"last_run_at": 1_000_500}),
                 run=JobRun(run_id="run_r0", status="ok", started_at=1_000_000,
                            ended_at=1_000_500, output="the answer"))
    store.add(Job(name="spare", schedule=Schedule(kind="every", every_s=60), message="x"))
    r.hset(keys.worker_beats(), WORKER, int(now * 1000) - 1_500)
    sandbox.publish(r, WORKER, SandboxReport(mode="none", state="none", detail="no sandbox",
                                             limits="none", run_command=True))


def skill(folder: Path, name: str, text: str | None = None) -> None:
    path = folder / name / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(text or f"---\nname: {name}\ndescription: The {name} skill.\n---\nDo it.\n")


@pytest.fixture(scope="module")
def served(scratch_redis_url: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    url = scratch_redis_url.rsplit("/", 1)[0] + "/15"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    home = tmp_path_factory.mktemp("openapi-home")
    skill(home / "skills", "deploy")
    skill(home / "skills", "broken", "no frontmatter here\n")
    app = create_app(Settings(redis_url=url, api_token=TOKEN, home=home, agents=AGENTS),
                     hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    with TestClient(app, raise_server_exceptions=False) as client:
        s = Served(client, r)
        seed(s)
        yield s
    r.close()


def v1_operations(raw: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in raw["paths"].items():
        if path.startswith("/v1/"):
            for method, op in ops.items():
                yield method.upper(), path, op


def test_every_v1_operation_declares_its_body_and_the_apps_errors(served: Served) -> None:
    operations = list(v1_operations(served.raw))
    components = served.raw["components"]["schemas"]
    assert len(operations) >= 41
    for method, path, op in operations:
        ok = {code: resp for code, resp in op["responses"].items() if code.startswith("2")}
        schemas = [media.get("schema") or media.get("itemSchema") for resp in ok.values()
                   for media in resp.get("content", {}).values()]
        assert ok and all(schemas), (method, path, ok)
        for code, resp in op["responses"].items():
            named = re.findall(r"#/components/schemas/(\w+)", str(resp.get("content")))
            if not code.startswith("2"):  # each an {"error": ...}: the app's, OpenAI's
                assert named, (method, path, code, resp)
                assert all("error" in components[n]["required"] for n in named), (
                    method, path, code, named)
    assert "HTTPValidationError" not in str(served.raw)


SEEDED_GETS: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    ("/v1/runs/{run_id}", {"run_id": "run"}, {}),
    ("/v1/runs/{run_id}", {"run_id": "queued"}, {}),
    ("/v1/runs/{run_id}/wait", {"run_id": "run"}, {"timeoutMs": 1000}),
    ("/v1/runs/{run_id}/wait", {"run_id": "queued"}, {"timeoutMs": 1}),
    ("/v1/runs/{run_id}/events", {"run_id": "run"}, {}),
    ("/v1/runs/{run_id}/timeline", {"run_id": "run"}, {}),
    ("/v1/status", {}, {}),
    ("/v1/fleet", {}, {}),
    ("/v1/conversations", {}, {}),
    ("/v1/conversations/{key}", {"key": "http|c2|root"}, {}),
    ("/v1/agents", {}, {}),
    ("/v1/approvals", {}, {}),
    ("/v1/approvals/{approval_id}", {"approval_id": "a0000001"}, {}),
    ("/v1/audit/recent", {}, {}),
    ("/v1/audit/verify", {}, {}),
    ("/v1/usage", {}, {}),
    ("/v1/usage", {}, {"scope": "agent"}),
    ("/v1/usage", {}, {"scope": "agent:default", "by": "hour", "last": 3}),
    ("/v1/usage", {}, {"by": "kind", "period": "day"}),
    ("/v1/budgets", {}, {}),
    ("/v1/tokens", {}, {}),
    ("/v1/schedules", {}, {}),
    ("/v1/schedules/{name}", {"name": "report"}, {}),
    ("/v1/skills", {}, {}),
    ("/v1/models", {}, {}),
    ("/v1/models/{model}", {"model": "fermix/default"}, {}),
]
# Answered with a refusal even when seeded: no worker runs here to make a record.
SEEDED_REFUSALS = [("/v1/runs/{run_id}/record", {"run_id": "run"}, 404),
                   ("/v1/runs/{run_id}/case", {"run_id": "run"}, 404)]


def test_every_get_answers_as_its_schema_says(served: Served) -> None:
    ids = served.ids
    called = set()
    for path, params, query in SEEDED_GETS:
        filled = {k: ids.get(v, v) for k, v in params.items()}
        resp = served.call("GET", path, 200, path_parameters=filled, query=query)
        called.add(path)
        if path in ("/v1/agents", "/v1/schedules", "/v1/approvals", "/v1/conversations"):
            assert resp.json()[path.rsplit("/", 1)[1]], (path, resp.text)
    for path, params, code in SEEDED_REFUSALS:
        served.call("GET", path, code, path_parameters={k: ids[v] for k, v in params.items()})
        called.add(path)
    gets = {path for method, path, _ in v1_operations(served.raw) if method == "GET"}
    assert called == gets, gets - called
    # A viewer of any role reads; an operator is refused an admin's list, as declared.
    served.call("GET", "/v1/tokens", 403, headers={"Authorization": f"Bearer {ids['operator']}"})
    served.call("GET", "/v1/status", 401, headers={"Authorization": "Bearer nope"})


def test_writes_answer_as_their_schema_says(served: Served) -> None:
    call = served.call
    call("POST", "/v1/approvals/{approval_id}", 200, path_parameters={"approval_id": "a0000002"},
         body={"decision": "deny", "reason": "not now"})
    call("POST", "/v1/approvals/{approval_id}", 409, path_parameters={"approval_id": "a0000002"},
         body={"decision": "approve"})
    call("POST", "/v1/agents/{name}/resume", 200, path_parameters={"name": "ops"})
    call("POST", "/v1/agents/{name}/pause", 404, path_parameters={"name": "nobody"})
    call("POST", "/v1/agents/{name}/kill", 409, path_parameters={"name": "helper"})
    call("POST", "/v1/schedules/{name}/pause", 200, path_parameters={"name": "report"})
    call("POST", "/v1/schedules/{name}/resume", 200, path_parameters={"name": "report"})
    call("POST", "/v1/schedules/{name}/run", 202, path_parameters={"name": "report"})
    call("DELETE", "/v1/schedules/{name}", 200, path_parameters={"name": "spare"})
    call("POST", "/v1/skills/reload", 200)
    call("POST", "/v1/tokens", 409, body={"name": "ops-1", "role": "viewer"})
    call("POST", "/v1/tokens", 201, body={"name": "gone", "role": "viewer"})
    call("DELETE", "/v1/tokens/{name}", 200, path_parameters={"name": "gone"})
    call("DELETE", "/v1/budgets", 200, query={"scope": "agent:default", "period": "day"})
    call("DELETE", "/v1/budgets", 404, query={"scope": "agent:default", "period": "day"})
    call("POST", "/v1/agent", 422, body={"message": "hi", "agent": "helper"})
    call("POST", "/v1/chat/completions", 200, body={
        "model": "fermix/default", "user": "c3", "messages": [{"role": "user", "content": "/help"}]})
    call("POST", "/v1/chat/completions", 404, body={
        "model": "fermix/nobody", "messages": [{"role": "user", "content": "hi"}]})
    call("POST", "/v1/chat/completions", 400, body={"model": "fermix/default", "messages": []})


def test_generated_gets_get_answers_their_schema_declares(served: Served) -> None:
    operations = [result.ok() for result in served.schema.include(path_regex="^/v1/", method="GET")
                  .get_all_operations()]
    assert len(operations) >= 23
    for operation in operations:
        @settings(max_examples=20, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def one(case: Any) -> None:
            if "timeout" in (case.query or {}) or "timeoutMs" in (case.query or {}):
                case.query = {}  # a wait on a run that exists would hold the test
            case.validate_response(served.request(case, ADMIN), checks=CHECKS)

        one()
