"""Fuzzing every inbound parser: Telegram updates, Slack events and slash commands, ``POST
/v1/agent`` (issue 13: 265 HTTP 500s and 86 connection resets from 3,000 malformed bodies).

The property: whatever the body (malformed, oversized, deeply nested, non-UTF-8, lone
surrogates, wrong types, wrong content type), the gateway answers below 500, and a 4xx carries
a reason. Webhook bodies are signed as the platform would sign them (Telegram's secret header,
Slack's v0 HMAC with a current timestamp), so the fuzzing reaches the parsers behind the
signature checks.

- In-process (fast): hypothesis drives the real app (tests/gateway/inprocess.py: middleware,
  routes, ``receive`` and the accept script on a real Redis), a few hundred cases per route,
  from payloads shaped like the real ones with any field replaced by anything, and from raw
  bytes. A deterministic corpus of the probe's categories runs too.
- The OpenAPI surface (``/v1/*``): schemathesis generates requests from the app's own schema,
  every method on every path, in-process.
- Fleet: the same corpus, oversized bodies (declared and streamed) and oversized headers through
  a real uvicorn gateway on one keep-alive connection: no 5xx, no reset; then a normal turn.

Run with ``-s`` to see the tally of answers per route.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply
from fermix_gateway.app import create_app
from fermix_shared.hooks import HookRegistry
from tests.conftest import Stack, provider_env, start_stack
from tests.fakes.slack_api import FakeSlack, sign
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq
from tests.gateway.inprocess import (
    SLACK_BOT,
    SLACK_OWNER,
    SLACK_SECRET,
    TG_BOT,
    TG_OWNER,
    TG_SECRET,
    RecordingCelery,
    flushed,
    gateway,
    settings_for,
)

ROUTES = {
    "telegram": "/webhooks/telegram",
    "slack_events": "/webhooks/slack/events",
    "slack_commands": "/webhooks/slack/commands",
    "agent": "/v1/agent",
}
FORM = "application/x-www-form-urlencoded"
EXAMPLES = 300
TALLY: dict[str, Counter[int]] = {route: Counter() for route in (*ROUTES, "openapi")}


def headers_for(route: str, body: bytes, content_type: str | None) -> dict[str, str]:
    """What the platform would send: the secret header or a valid v0 signature."""
    headers = {"Content-Type": content_type} if content_type is not None else {}
    if route == "telegram":
        headers["X-Telegram-Bot-Api-Secret-Token"] = TG_SECRET
    elif route.startswith("slack"):
        headers.update(sign(body, SLACK_SECRET))
    return headers


def check(route: str, status: int, answer: bytes) -> None:
    """Below 500; a 4xx says why (``{"error": ...}``, or FastAPI's ``{"detail": ...}``)."""
    TALLY[route][status] += 1
    assert status < 500, (route, status, answer[:300])
    if status >= 400:
        reason = json.loads(answer)
        assert reason.get("error") or reason.get("detail"), (route, status, reason)


# --- strategies ------------------------------------------------------------------------------

# Any code point, lone surrogates included.
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
tricky_text = st.sampled_from([
    "", " ", "\x00", "a|b", "two words", "x" * 250, "\ud800", "\udfff tail", "😀", "/stop",
    "/ultra", "/queue reject", "/new", "/fermix status", f"@{TG_BOT} hi", f"<@{SLACK_BOT}> hi",
    "&lt;&gt;&amp;", "\n", "1e400", "NaN", "-0", "{", "ﬁ", "\u202e",
])
text = any_text | tricky_text | st.text(max_size=30)
ints = st.integers() | st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 10**30])
scalars = (st.none() | st.booleans() | ints | st.floats() | text)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(text, kids, max_size=4),
    max_leaves=12,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field as it should be, mostly; sometimes anything at all."""
    return st.one_of(strategy, strategy, json_values)


tg_user = st.fixed_dictionaries(
    {"id": maybe(st.sampled_from([TG_OWNER, 999]) | ints)},
    optional={"is_bot": maybe(st.booleans()), "username": maybe(text)},
)
tg_message = st.fixed_dictionaries(
    {"message_id": maybe(ints), "chat": maybe(st.fixed_dictionaries({
        "id": maybe(st.sampled_from([TG_OWNER, -1001234567890]) | ints),
        "type": maybe(st.sampled_from(["private", "group", "supergroup", "channel"]))}))},
    optional={"from": maybe(tg_user), "text": maybe(text), "caption": maybe(text),
              "message_thread_id": maybe(ints), "is_topic_message": maybe(st.booleans()),
              "reply_to_message": maybe(st.fixed_dictionaries({}, optional={"from": tg_user}))},
)
tg_updates = st.fixed_dictionaries(
    {"update_id": maybe(ints)},
    optional={"message": maybe(tg_message), "edited_message": json_values},
)
slack_ids = st.sampled_from([SLACK_OWNER, SLACK_BOT, "D024BE91L", "C1", "1.000001"]) | text
slack_event = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["message", "app_mention", "reaction_added"]))},
    optional={"channel_type": maybe(st.just("im")), "channel": maybe(slack_ids),
              "user": maybe(slack_ids), "text": maybe(text), "ts": maybe(slack_ids),
              "thread_ts": maybe(slack_ids), "subtype": maybe(text), "bot_id": json_values},
)
slack_payloads = st.one_of(
    st.fixed_dictionaries({"type": st.just("url_verification"), "challenge": maybe(text)}),
    st.fixed_dictionaries(
        {"type": maybe(st.just("event_callback")), "event": maybe(slack_event)},
        optional={"event_id": maybe(slack_ids), "authorizations": json_values}),
)
slack_forms = st.fixed_dictionaries(
    {"command": maybe(st.sampled_from(["/stop", "/fermix", "/ultra", "/queue", "/status"])),
     "channel_id": maybe(slack_ids), "user_id": maybe(slack_ids),
     "trigger_id": maybe(slack_ids | st.uuids().map(str))},
    optional={"text": maybe(text), "team_id": json_values},
) | st.dictionaries(text, text, max_size=5)
agent_bodies = st.fixed_dictionaries(
    {"message": maybe(text)},
    optional={"chatId": maybe(slack_ids | ints), "threadScope": maybe(slack_ids),
              "profile": maybe(st.sampled_from(["default", "ultra"])), "messageId": maybe(text)},
) | st.fixed_dictionaries({"message": text, "extra": json_values}) | st.fixed_dictionaries(
    {"message": st.text(min_size=1), "chatId": slack_ids | ints})


def as_json(value: Any, ascii_only: bool) -> bytes:
    """JSON bytes; lone surrogates become ``\\udxxx`` escapes, or (not ASCII-only) the invalid
    UTF-8 a careless encoder writes for them."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def as_form(value: dict[str, Any], _ascii_only: bool) -> bytes:
    return urlencode({str(k): str(v) for k, v in value.items()},
                     errors="surrogatepass").encode("utf-8", "surrogatepass")


def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def bodies(payloads: st.SearchStrategy[Any], encode: Callable[[Any, bool], bytes]
           ) -> st.SearchStrategy[bytes]:
    shaped = st.builds(encode, payloads, st.booleans())
    return st.one_of(
        shaped, shaped, shaped,
        st.binary(max_size=300),
        st.builds(lambda b, i: b[:i], shaped, st.integers(0, 200)),  # cut short
        st.builds(lambda b, i, junk: b[:i] + junk + b[i:], shaped, st.integers(0, 200),
                  st.sampled_from([b"\xff", b"\x00", b"\\ud800", b"\xed\xa0\x80", b'"', b"}"])),
        st.builds(nested, st.integers(1, 5_000), st.sampled_from(["list", "dict"])),
        st.builds(as_json, json_values, st.booleans()),
    )


# Mostly the right one (FastAPI reads only a JSON content type as JSON), sometimes not.
content_types = st.sampled_from(["application/json"] * 24 + [
    FORM, "text/plain", "application/octet-stream", "multipart/form-data; boundary=xyz",
    "application/json; charset=utf-16", "", None,
])
FUZZ = {
    "telegram": bodies(tg_updates, as_json),
    "slack_events": bodies(slack_payloads, as_json),
    "slack_commands": bodies(slack_forms, as_form),
    "agent": bodies(agent_bodies, as_json),
}


# --- in-process ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app(scratch_redis_url: str) -> Iterator[TestClient]:
    """One app for every case of the module (cases share its Redis: limits kick in, too)."""
    url = flushed(scratch_redis_url.rsplit("/", 1)[0] + "/3")
    with gateway(url) as (client, _celery):
        yield client


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    started = time.monotonic()
    yield
    total = sum(sum(c.values()) for c in TALLY.values())
    print(f"\nfuzz: {total} requests in {time.monotonic() - started:.1f} s")
    for route, counts in TALLY.items():
        print(f"  {route:15s} " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))


@pytest.mark.parametrize("route", ROUTES)
def test_any_body_gets_an_answer_below_500_with_a_reason(app: TestClient, route: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=FUZZ[route], content_type=content_types)
    def one(body: bytes, content_type: str | None) -> None:
        resp = app.post(ROUTES[route], content=body,
                        headers=headers_for(route, body, content_type))
        check(route, resp.status_code, resp.content)

    one()


# Every field of a valid body, replaced by each of these in turn.
HOSTILE_VALUES: list[Any] = [
    None, True, [], {}, [[[[[[[[1]]]]]]]], 0, -1, 10**30, 1e308, "", " ", "a|b c", "\ud800",
    "x" * 40_000, {"nested": json.loads(nested(60, "list"))},
]


def valid_bodies(tg_user: int, slack_user: str) -> dict[str, dict[str, Any]]:
    return {
        "telegram": {"update_id": 7, "message": {
            "message_id": 1, "date": 1, "text": "hello", "from": {"id": tg_user, "is_bot": False},
            "chat": {"id": tg_user, "type": "private"}}},
        "slack_events": {"type": "event_callback", "event_id": "Ev9", "event": {
            "type": "message", "channel_type": "im", "channel": "D1", "user": slack_user,
            "text": "hello", "ts": "1.1", "thread_ts": "1.0"}},
        "slack_commands": {"command": "/fermix", "text": "hello", "channel_id": "C1",
                           "user_id": slack_user, "trigger_id": "1.2.3"},
        "agent": {"message": "hello", "chatId": "fuzz", "threadScope": "t",
                  "profile": "default", "messageId": "m1"},
    }


def field_paths(value: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, item in value.items():
        yield (*prefix, key)
        if isinstance(item, dict):
            yield from field_paths(item, (*prefix, key))


def replaced(value: dict[str, Any], path: tuple[str, ...], new: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(value))
    inner = out
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = new
    return dict(out)


def corpus(route: str, tg_user: int = TG_OWNER, slack_user: str = SLACK_OWNER
           ) -> list[tuple[str, str | None, bytes]]:
    """The probe's categories, deterministic: (name, content type, body); then every field of
    a valid body replaced by each of :data:`HOSTILE_VALUES`."""
    deep_list, deep_dict = nested(10_000, "list"), nested(10_000, "dict")
    cases: list[tuple[str, str | None, bytes]] = [
        ("empty", "application/json", b""),
        ("not json", "application/json", b"{not json"),
        ("array", "application/json", b"[1, 2]"),
        ("string", "application/json", b'"hello"'),
        ("null", "application/json", b"null"),
        ("nested 10000 lists", "application/json", deep_list),
        ("nested 10000 objects", "application/json", deep_dict),
        ("nested 900 in a field", "application/json",
         b'{"update_id": 1, "message": ' + nested(900, "list") + b"}"),
        ("utf-16", "application/json", '{"a": 1}'.encode("utf-16")),
        ("latin-1", "application/json", '{"message": "café"}'.encode("latin-1")),
        ("raw surrogate bytes", "application/json", b'{"message": "\xed\xa0\x80"}'),
        ("escaped lone surrogate", "application/json", b'{"message": "hi \\ud800"}'),
        ("surrogate key", "application/json", b'{"\\udfff": 1, "message": "hi"}'),
        ("NaN", "application/json", b'{"update_id": NaN, "message": NaN}'),
        ("huge int", "application/json", b'{"update_id": ' + b"9" * 5_000 + b"}"),
        ("nul bytes", "application/json", b'{"message": "\\u0000\x00"}'),
        ("form as json", FORM, b"message=hi&chatId=1"),
        ("multipart", "multipart/form-data; boundary=xyz",
         b'--xyz\r\nContent-Disposition: form-data; name="message"\r\n\r\nhi\r\n--xyz--\r\n'),
        ("text/plain", "text/plain", b'{"message": "hi"}'),
        ("no content type", None, b'{"message": "hi"}'),
        ("960 KB", "application/json", b'{"message": "' + b"a" * 960_000 + b'"}'),
        ("95 KB message", "application/json", json.dumps({"message": "b" * 95_000}).encode()),
    ]
    shaped: dict[str, list[Any]] = {
        "telegram": [
            {"update_id": "abc", "message": {}},
            {"update_id": 1, "message": [1]},
            {"update_id": 1, "message": {"message_id": 1, "chat": {"id": "x", "type": 5}}},
            {"update_id": 1, "message": {"message_id": 1, "from": {"id": 999},
                                         "chat": {"id": 999, "type": "private"}, "text": ["x"]}},
            {"update_id": 10**30, "message": {"message_id": 10**30, "from": {"id": 999},
                                              "chat": {"id": 999, "type": "private"},
                                              "text": "hi", "message_thread_id": -(10**30)}},
        ],
        "slack_events": [
            {"type": "event_callback", "event_id": "Ev1", "event": [1, 2]},
            {"type": "event_callback", "event_id": "Ev1", "event": "message"},
            {"type": "event_callback", "event_id": "Ev1", "event": None},
            {"type": "url_verification", "challenge": ["x"]},
            {"type": "url_verification"},
            {"type": ["event_callback"], "event": {}},
            {"type": "event_callback", "event_id": "Ev 1|x", "event": {
                "type": "message", "channel_type": "im", "channel": "D1", "user": "U9",
                "text": "hi", "ts": "1.1"}},
            {"type": "event_callback", "event_id": "Ev2", "event": {
                "type": "message", "channel_type": "im", "channel": "D1", "user": "U9",
                "text": {"a": 1}, "ts": 1.1, "thread_ts": ["x"]}},
        ],
        "slack_commands": [],
        "agent": [
            {"message": ["x"]}, {"message": ""}, {"message": "hi", "chatId": "a|b"},
            {"message": "hi", "chatId": ["x"]}, {"message": "hi", "profile": "turbo"},
            {"message": "hi", "messageId": ""}, {"message": "hi", "unknown": 1},
            {"message": "x" * 32_001}, {"message": "hi", "chatId": 1e308},
        ],
    }
    cases += [(f"shaped {i}", "application/json", json.dumps(p).encode())
              for i, p in enumerate(shaped[route])]
    base = valid_bodies(tg_user, slack_user)[route]
    for path in field_paths(base):
        for i, value in enumerate(HOSTILE_VALUES):
            body = replaced(base, path, value)
            encoded = (as_form(body, True) if route == "slack_commands"
                       else as_json(body, i % 2 == 0))
            ctype = FORM if route == "slack_commands" else "application/json"
            cases.append((f"{'.'.join(path)} = {str(value)[:20]!r}", ctype, encoded))
    cases += [
        ("lone surrogate challenge", "application/json",
         b'{"type": "url_verification", "challenge": "\\ud800"}'),
        ("form: bad percent utf-8", FORM,
         b"command=%2Fstop&channel_id=C1&user_id=U9&trigger_id=1.2&text=%ff"),
        ("form: raw bad utf-8", FORM, b"command=%2Fstop&channel_id=C1&user_id=U9&text=\xff"),
        ("form: surrogate", FORM, b"command=%2Fstop&channel_id=C1&user_id=U9&trigger_id=1&"
                                  b"text=%ED%A0%80"),
        ("form: ids with spaces", FORM, b"command=%2Fstop&channel_id=C+1%7Cx&user_id=U9&"
                                        b"trigger_id=1.2"),
        ("form: 5000 fields", FORM, b"&".join(b"f%d=1" % i for i in range(5_000))),
        ("form: no fields", FORM, b"&&&==&"),
    ]
    return cases


@pytest.mark.parametrize("route", ROUTES)
def test_the_probe_corpus_gets_answers_below_500(app: TestClient, route: str) -> None:
    for name, content_type, body in corpus(route):
        resp = app.post(ROUTES[route], content=body,
                        headers=headers_for(route, body, content_type))
        assert resp.status_code < 500, (name, resp.status_code, resp.text[:300])
        check(route, resp.status_code, resp.content)


# --- the OpenAPI surface ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def openapi(scratch_redis_url: str) -> Any:
    app = create_app(settings_for(scratch_redis_url.rsplit("/", 1)[0] + "/3"),
                     hooks=HookRegistry())
    app.state.tasks = RecordingCelery()
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def test_the_openapi_surface_answers_below_500(openapi: Any) -> None:
    # Driven by hand: schemathesis' lazy pytest integration does not run on pytest 9.
    operations = [result.ok() for result in openapi.include(path_regex="^/v1/")
                  .get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/agent", "/v1/runs/{run_id}", "/v1/status"}
    for operation in operations:
        @settings(max_examples=50, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def one(case: Any) -> None:
            resp = case.call()
            TALLY["openapi"][resp.status_code] += 1
            assert resp.status_code < 500, (case.method, case.formatted_path, case.body,
                                            resp.text[:300])

        one()


# --- through a real uvicorn ------------------------------------------------------------------

@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    with FakeTelegram() as tg, FakeSlack(bot_user_id=SLACK_BOT) as slack:
        env = {
            **provider_env(llm, "openai"),
            "FERMIX_TELEGRAM_BOT_TOKEN": tg.token, "FERMIX_TELEGRAM_API_BASE": tg.url,
            "FERMIX_TELEGRAM_WEBHOOK_SECRET": TG_SECRET, "FERMIX_TELEGRAM_BOT_USERNAME": TG_BOT,
            "FERMIX_SLACK_BOT_TOKEN": "xoxb-test", "FERMIX_SLACK_API_BASE": slack.url,
            "FERMIX_SLACK_SIGNING_SECRET": SLACK_SECRET, "FERMIX_SLACK_BOT_USER_ID": SLACK_BOT,
            "FERMIX_OWNER_IDS": f"telegram:{TG_OWNER},slack:{SLACK_OWNER}",
        }
        s = start_stack("fuzz", redis_url, 4, env, logs_dir, workers=1)
        yield s
        s.stop()


def read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response with a Content-Length body (what uvicorn sends us here)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            return data
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return head + b"\r\n\r\n" + body


def raw_exchange(url: str, head: bytes, chunks: Iterator[bytes], then: bytes = b""
                 ) -> tuple[bytes, bytes]:
    """Send ``head``, then ``chunks`` until the server answers (or they run out), then
    ``then`` on the same connection; returns both answers. A reset raises."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # answered before the body was all sent
            sock.sendall(chunk)
        answer = read_response(sock)
        second = b""
        if then:
            sock.sendall(then)
            second = read_response(sock)
        return answer, second


def test_a_real_gateway_survives_hostile_bodies_and_still_answers(
    stack: Stack, llm: ScriptedLLMServer
) -> None:
    sent = 0
    with stack.http() as http:  # one keep-alive connection: a reset would raise here
        for route, path in ROUTES.items():
            # Strangers: what parses is dropped, so no turn runs behind the test's back.
            for name, content_type, body in corpus(route, tg_user=999, slack_user="U999"):
                resp = http.post(path, content=body, headers=headers_for(route, body,
                                                                         content_type))
                assert resp.status_code < 500, (route, name, resp.status_code, resp.text[:300])
                check(route, resp.status_code, resp.content)
                sent += 1
        assert sent >= 400

        # 50 MB declared: refused before the body is sent (the server does not wait for it).
        head = (b"POST /v1/agent HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 52428800\r\n\r\n")
        answer, _ = raw_exchange(stack.url, head, iter([b"a" * 65536] * 800))
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

        # Streamed (chunked) past 1 MiB: cut off there; the connection lives on.
        head = (b"POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"X-Telegram-Bot-Api-Secret-Token: " + TG_SECRET.encode() + b"\r\n\r\n")
        chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"
        answer, after = raw_exchange(stack.url, head, iter([chunk] * 64),
                                     then=b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"request body is larger than 1048576 bytes" in answer
        assert after.startswith(b"HTTP/1.1 200"), after[:200]

        # A 1 MB header: uvicorn's own 400 ("Invalid HTTP request received."), not a reset.
        big = http.post("/v1/agent", json={"message": "hi"}, headers={"X-Pad": "p" * 1_000_000})
        assert big.status_code == 400, big.text

        text = uniq("still-here")
        llm.script.push(Reply(text="Still answering.", match=text))
        resp = http.post("/v1/agent", json={"message": text, "chatId": uniq("chat")})
        assert resp.status_code == 202, resp.text
        waited = http.get(f"/v1/runs/{resp.json()['runId']}/wait", params={"timeout": 30},
                          timeout=40).json()
    assert (waited["status"], waited.get("reply")) == ("ok", "Still answering.")
    log = (stack.logs / "fuzz-gateway.log").read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
