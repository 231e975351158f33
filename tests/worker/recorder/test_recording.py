"""The recorder's writes on a private Redis: requests stored as their change since the one
before and read back whole, secrets masked before they are stored, and a record that stops at
``[recorder] max_bytes`` with a ``cut`` entry."""

from __future__ import annotations

import redis

from fermix_shared import keys
from fermix_shared import recorder as rec
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.settings import Settings
from fermix_worker.loop_state import LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn, ToolSpec
from fermix_worker.recorder.recording import Recorder, RecordingProvider, RecordingTools
from fermix_worker.tools.base import Tool, ToolRegistry, ToolResult
from fermix_worker.tools.context import RunContext

SECRET = "sk-live-0123456789abcdef"


class Answers:
    def __init__(self) -> None:
        self.n = 0

    def chat(self, request: ModelRequest, on_delta: object) -> ModelTurn:
        self.n += 1
        return ModelTurn(f"answer {self.n}", [], 10, 2)

    def continue_(self, provider_state: object, tool_results: object, opts: ModelRequest,
                  on_delta: object) -> ModelTurn:
        return self.chat(opts, on_delta)


def state(run_id: str) -> LoopState:
    return LoopState.start(run_id=run_id, model="m", system="be brief", history=[],
                           user=ChatMessage(role="user", content="hi"))


def test_requests_are_stored_as_changes_and_read_back_whole(r: redis.Redis,
                                                            scratch_redis_url: str) -> None:
    s = state("run_rec_delta")
    provider = RecordingProvider(Answers(), Recorder(r, Settings(redis_url=scratch_redis_url)), s)
    tools = [ToolSpec("calculator", "adds", {"type": "object"})]
    whole = []
    for i in range(3):
        request = ModelRequest("m", s.system, s.messages, tools)
        whole.append([m.model_dump() for m in s.messages])
        turn = provider.chat(request, lambda t: None)
        s.iteration += 1
        s.messages.append(ChatMessage(role="assistant", content=turn.content))
        s.messages.append(ChatMessage(role="user", content=f"more {i}"))
    got = rec.read(r, "run_rec_delta")
    assert got is not None
    stored = [e for e in got.entries if isinstance(e, rec.ModelCall)]
    # The second and third requests hold only what was added, not the system prompt or tools.
    assert [len(e.request.messages) for e in stored] == [1, 2, 2]
    assert stored[1].request.system is None and stored[1].request.tools is None
    requests = got.requests()
    assert [[m.model_dump() for m in requests[i].messages] for i in range(3)] == whole
    assert requests[2].system == "be brief" and requests[2].tools == [
        {"name": "calculator", "description": "adds", "parameters": {"type": "object"}}]
    assert got.calls[1].response is not None and got.calls[1].response.content == "answer 2"


def test_secrets_are_masked_before_they_are_stored(r: redis.Redis, scratch_redis_url: str
                                                   ) -> None:
    settings = Settings(redis_url=scratch_redis_url, api_token=SECRET)
    leaky = Tool(name="env", description="prints", parameters={"type": "object"},
                 run=lambda args, ctx: f"the key is {SECRET}")
    tools = RecordingTools(ToolRegistry([leaky]), Recorder(r, settings), "run_rec_mask")
    result = tools.execute(ToolCall(id="c1", name="env"), RunContext())
    assert result == ToolResult(f"the key is {SECRET}")  # the turn itself sees the result
    raw = r.lrange(keys.run_record("run_rec_mask"), 0, -1)
    assert raw and SECRET not in "".join(raw)
    assert "the key is" in "".join(raw)


def test_a_record_stops_at_its_cap_with_a_cut_entry(r: redis.Redis, scratch_redis_url: str
                                                    ) -> None:
    settings = Settings(redis_url=scratch_redis_url,
                        recorder={"max_bytes": 10_000, "keep_days": 1})  # type: ignore[arg-type]
    recorder = Recorder(r, settings)
    run = "run_rec_cap"
    for i in range(20):
        recorder.write(run, rec.ToolRun(call=ToolCall(id=f"c{i}", name="t"), content="x" * 900))
    got = rec.read(r, run)
    assert got is not None and got.cut is not None and got.cut.max_bytes == 10_000
    assert len(got.tools) == 10  # ten ~950-byte entries fit under 10,000 bytes
    assert isinstance(got.entries[-1], rec.Cut)
    assert 0 < r.ttl(keys.run_record(run)) <= 86400
    assert r.get(keys.run_record_size(run)) == "cut"
