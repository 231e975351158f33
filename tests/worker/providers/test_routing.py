"""Provider routing: the seed's failover, same-provider retry and continuation retry rules,
through the real SDK adapters against the scripted LLM server (no Celery, no Redis). Waits are
recorded, not slept. Every test has its own match token and its routes distinct model names,
so the requests each route received can be counted from the server's log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fermix_dev.scripted_llm import Disconnect, Fail, Hang, Reply, ScriptedLLMServer
from fermix_shared.errors import (
    AllProvidersFailed,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)
from fermix_shared.messages import ChatMessage
from fermix_shared.settings import Settings
from fermix_worker.providers import (
    ModelRequest,
    ModelTurn,
    ProviderRoute,
    build_router,
    failure_message,
)
from fermix_worker.providers.routing import RoutedProvider

KEY_ENV = "FERMIX_TEST_ROUTE_KEY"


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _route_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "test-key")


class Harness:
    """A router over routes named ``provider/model`` on the server, recording waits, events
    and deltas."""

    def __init__(self, server: ScriptedLLMServer, *names: str, timeout: float = 5.0) -> None:
        self.server = server
        self.token = f"tok-{uuid.uuid4().hex[:10]}"
        self.waits: list[float] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.deltas: list[str] = []
        self.router: RoutedProvider = build_router(
            Settings(), [self._route(name, timeout) for name in names],
            sleep=self.waits.append, on_event=self._event,
        )  # fmt: skip

    def _route(self, name: str, timeout: float) -> ProviderRoute:
        provider, model = name.split("/")
        if provider == "openai":
            return ProviderRoute(name, "openai", model, self.server.openai_base_url, KEY_ENV, timeout)
        return ProviderRoute(name, "anthropic", model, self.server.anthropic_base_url, KEY_ENV, timeout)

    def _event(self, kind: str, /, **data: Any) -> None:
        self.events.append((kind, data))

    def push(self, *entries: Reply | Fail | Hang | Disconnect) -> None:
        for e in entries:
            e.match = self.token
        self.server.script.push(*entries)

    def complete(self, *, initial: bool) -> ModelTurn:
        msg = ChatMessage(role="user", content=f"hello {self.token}")
        request = ModelRequest(model="ignored-by-the-router", system="be brief", messages=[msg])
        return self.router.complete(request, self.deltas.append, initial=initial)

    def models(self) -> list[str]:
        """The model of every request this test's token reached, in order."""
        return [
            r["body"]["model"]
            for r in self.server.script.requests
            if self.token in json.dumps(r["body"])
        ]


# --- initial call: same-route retry, then failover ----------------------------------------


def test_a_transient_500_is_retried_on_the_same_route_and_answers(server: ScriptedLLMServer) -> None:
    h = Harness(server, "openai/prim-a", "anthropic/fall-a")
    h.push(Fail(500), Fail(500), Reply("recovered"))
    turn = h.complete(initial=True)
    assert turn.content == "recovered" and turn.route == "openai/prim-a"
    assert h.models() == ["prim-a"] * 3
    assert h.waits == [0.5, 1.0]
    assert h.events == [
        ("retry", {"route": "openai/prim-a", "attempt": 1, "delay": 0.5, "reason": "HTTP 500", "initial": True}),
        ("retry", {"route": "openai/prim-a", "attempt": 2, "delay": 1.0, "reason": "HTTP 500", "initial": True}),
    ]


@pytest.mark.parametrize(("provider", "status"), [("openai", 503), ("anthropic", 529)])
def test_a_primary_failing_three_times_fails_over_and_continuations_stay_there(
    server: ScriptedLLMServer, provider: str, status: int
) -> None:
    other = "anthropic" if provider == "openai" else "openai"
    h = Harness(server, f"{provider}/prim-b", f"{other}/fall-b")
    h.push(Fail(status), Fail(status), Fail(status), Reply("from the fallback"))
    turn = h.complete(initial=True)
    assert turn.content == "from the fallback" and turn.route == f"{other}/fall-b"
    assert h.models() == ["prim-b"] * 3 + ["fall-b"]
    assert h.waits == [0.5, 1.0]
    assert [kind for kind, _ in h.events] == ["retry", "retry", "failover"]
    assert h.events[-1][1]["from_route"] == f"{provider}/prim-b"
    assert h.events[-1][1]["to_route"] == f"{other}/fall-b"
    # The provider never changes within the turn: the continuation goes to the fallback too.
    h.push(Reply("continued"))
    assert h.complete(initial=False).content == "continued"
    assert h.models()[-1] == "fall-b"
    assert h.router.pinned == f"{other}/fall-b"


@pytest.mark.parametrize(
    ("fail", "reason"),
    [(Fail(429, retry_after=30), "rate-limited, resets in ~1 min"), (Fail(401), "HTTP 401")],
)
def test_a_refused_primary_fails_over_at_once(
    server: ScriptedLLMServer, fail: Fail, reason: str
) -> None:
    h = Harness(server, "openai/prim-c", "anthropic/fall-c")
    h.push(Fail(fail.status, retry_after=fail.retry_after), Reply("fallback answered"))
    assert h.complete(initial=True).content == "fallback answered"
    assert h.models() == ["prim-c", "fall-c"]
    assert h.waits == []
    assert h.events == [("failover", {
        "from_route": "openai/prim-c", "to_route": "anthropic/fall-c", "reason": reason,
    })]  # fmt: skip


def test_a_stream_that_delivered_content_is_neither_retried_nor_failed_over(
    server: ScriptedLLMServer,
) -> None:
    h = Harness(server, "openai/prim-e", "anthropic/fall-e")
    # Events: the role chunk, then two words; then the connection drops.
    h.push(Disconnect(after_chunks=3, text="partial answer that never ends"))
    with pytest.raises(ProviderUnavailable) as err:
        h.complete(initial=True)
    assert h.deltas == ["partial", " answer"]
    assert h.models() == ["prim-e"]
    assert h.waits == [] and h.events == []
    assert err.value.bytes_received and not err.value.timeout
    assert failure_message(err.value).startswith("I couldn't reach the model provider (openai): ")


# --- terminal errors and their messages ----------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "fail", "message"),
    [
        ("openai", Fail(429, retry_after=300),
         "You’ve hit your openai usage limit. Try again in ~5 min."),
        ("openai", Fail(429),
         "openai is rate-limiting requests right now. Please try again in a minute."),
        ("anthropic", Fail(402, "Your credit balance is too low to access the Anthropic API."),
         "Your anthropic quota is used up. Check the plan and billing, then try again."),
    ],
)  # fmt: skip
def test_the_only_route_refusing_for_rate_or_quota_says_what_to_do(
    server: ScriptedLLMServer, provider: str, fail: Fail, message: str
) -> None:
    h = Harness(server, f"{provider}/only-f")
    h.push(Fail(fail.status, fail.message, retry_after=fail.retry_after))
    with pytest.raises(ProviderRateLimited) as err:
        h.complete(initial=True)
    assert failure_message(err.value) == message
    assert h.models() == ["only-f"] and h.waits == [] and h.events == []


@pytest.mark.parametrize(
    ("fails", "message"),
    [
        ([Fail(401), Fail(503), Fail(503), Fail(503)],
         "All model providers failed (openai: HTTP 401; anthropic: HTTP 503). "
         "Please try again in a moment."),
        # The seed: a rate limit with a reset time is terminal when the chain is exhausted.
        ([Fail(400), Fail(429, retry_after=90)],
         "You’ve hit your anthropic usage limit. Try again in ~2 min."),
    ],
)  # fmt: skip
def test_all_routes_failing(server: ScriptedLLMServer, fails: list[Fail], message: str) -> None:
    h = Harness(server, "openai/prim-h", "anthropic/fall-h")
    h.push(*(Fail(f.status, retry_after=f.retry_after) for f in fails))
    with pytest.raises(AllProvidersFailed) as err:
        h.complete(initial=True)
    assert failure_message(err.value) == message
    assert [r for r, _ in err.value.failures] == ["openai/prim-h", "anthropic/fall-h"]
    assert h.models() == ["prim-h"] + ["fall-h"] * (len(fails) - 1)
    assert h.waits == [0.5, 1.0][: len(fails) - 2]


# --- continuation calls: the narrow in-place retry -----------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_continuation_that_timed_out_before_any_data_is_reissued(
    server: ScriptedLLMServer, provider: str
) -> None:
    h = Harness(server, f"{provider}/only-j", "openai/fall-j", timeout=0.5)
    h.push(Hang(5), Hang(5), Reply("third time lucky"))
    assert h.complete(initial=False).content == "third time lucky"
    assert h.models() == ["only-j"] * 3
    assert h.waits == [2.0, 4.0]
    assert [(k, d["reason"]) for k, d in h.events] == [("retry", "timed out")] * 2
    # Timing out a third time ends the call: two retries, and never another provider.
    h.push(Hang(5), Hang(5), Hang(5))
    with pytest.raises(ProviderUnavailable) as err:
        h.complete(initial=False)
    assert err.value.timeout and not err.value.bytes_received
    assert h.models() == ["only-j"] * 6 and h.waits == [2.0, 4.0] * 2
    assert failure_message(err.value).startswith(f"I couldn't reach the model provider ({provider}): ")


def test_a_continuation_error_fails_at_once_on_its_own_route(server: ScriptedLLMServer) -> None:
    h = Harness(server, "openai/prim-l", "anthropic/fall-l")
    h.push(Reply("first"), Fail(500))
    h.complete(initial=True)
    with pytest.raises(ProviderError) as err:
        h.complete(initial=False)
    assert err.value.status == 500
    assert h.models() == ["prim-l", "prim-l"]
    assert h.waits == [] and h.events == []
    assert failure_message(err.value).startswith("The model provider failed: openai returned HTTP 500")


def test_a_continuation_timeout_after_the_stream_began_is_not_reissued(
    server: ScriptedLLMServer,
) -> None:
    h = Harness(server, "openai/only-m", timeout=0.5)
    h.push(Reply("slow words here", chunk_delay=2.0))
    with pytest.raises(ProviderUnavailable) as err:
        h.complete(initial=False)
    assert err.value.timeout and err.value.bytes_received
    assert h.models() == ["only-m"] and h.waits == []
