"""Billed input tokens of a 5-step tool turn, before and after prompt caching, on the scripted
model (which reports cache reads and writes as the APIs do: fermix_dev/scripted_llm/prompt_cache.py).

A turn is five model calls made as the loop makes them (``chat``, then ``continue_`` from the
adapter's own transcript), four tool rounds then the answer, through the real adapters and SDKs
(built by ``adapter_for`` from ``Settings(prompt_cache=...)``). Three turns of one conversation,
a day apart, each with other facts recalled: turn 1 has no history yet, turn 3 two turns of it.

- before: the prompt as commit 8983e4a composed it (base, recalled facts and the date note in
  the system prompt) and no ``cache_control`` (``prompt_cache = false``);
- after: :func:`fermix_worker.turn.prepare.prepare`'s prompt (the facts and date in a note
  after the history) and the breakpoints (``prompt_cache = true``, the default).

Billed input tokens, in input-token equivalents, at the providers' documented multipliers:
Anthropic ``input + 1.25 x cache writes (5-minute) + 0.1 x cache reads``; OpenAI ``uncached +
0.25 x cached`` (gpt-4.1 family: cached input at a quarter of the input price; gpt-4o 0.5,
gpt-5 0.1; OpenAI never charges for writes). The scripted model is deterministic: the token
numbers are the same at every repeat; the wall time of a turn is reported too.

Run: ``.venv/bin/python benchmarks/prompt_cache.py [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from fermix_dev.scripted_llm import Reply, ScriptedLLMServer
from fermix_dev.scripted_llm.script import ToolCallSpec
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.provider_routes import ProviderRoute
from fermix_shared.settings import Settings
from fermix_worker.providers.base import ModelRequest, ModelTurn, Provider
from fermix_worker.providers.routes import adapter_for
from fermix_worker.tools import BUILTIN_TOOLS, ToolRegistry
from fermix_worker.turn.prepare import TurnInputs, prepare

STEPS = 5
MULTIPLIERS = {"anthropic": (1.25, 0.1), "openai": (0.0, 0.25)}  # (cache write, cache read)
# An agent prompt of ~2,300 tokens: the default system prompt and a memory file (AGENTS.md).
BASE = (Settings().system_prompt + "\n\n## Memory files\n\n### AGENTS.md\n"
        + "".join(f"- Rule {i}: when the user asks about topic {i}, check the archive first, "
                  "cite what you found, and say plainly when nothing was found.\n"
                  for i in range(70)))
TOOLS = ToolRegistry(list(BUILTIN_TOOLS)).specs()
TURNS = 3
DAY1 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


@dataclass(frozen=True)
class Billed:
    prompt: int = 0
    uncached: int = 0
    written: int = 0
    read: int = 0
    billed: float = 0.0

    def add(self, turn: ModelTurn, provider: str) -> Billed:
        write, read = MULTIPLIERS[provider]
        unc = turn.uncached_input_tokens
        return Billed(self.prompt + turn.input_tokens, self.uncached + unc,
                      self.written + turn.cache_write_tokens, self.read + turn.cache_read_tokens,
                      self.billed + unc + write * turn.cache_write_tokens
                      + read * turn.cache_read_tokens)


def facts(day: int) -> str:
    return "<memory>\n" + "".join(f"- [m{day}{i}] fact {i} recalled for day {day}\n"
                                  for i in range(3)) + "</memory>"


def request(after: bool, provider: str, history: list[ChatMessage], text: str,
            now: datetime, recalled: str) -> ModelRequest:
    model = f"scripted-{provider}"
    if after:
        msg = InboundMessage(key=ConversationKey(channel="http", chat_id="bench"), text=text)
        state = prepare(TurnInputs(messages=[msg], history=history, prompt_base=BASE,
                                   facts=recalled, now=now, model=model))
        return ModelRequest(model, state.system, state.messages, TOOLS)
    today = now.strftime("%A %Y-%m-%d %H:%M UTC")  # commit 8983e4a's system_prompt
    system = "\n\n".join((BASE, recalled, f"Current date: {today}."))
    return ModelRequest(model, system, [*history, ChatMessage(role="user", content=text)], TOOLS)


def run_turn(provider: Provider, name: str, llm: ScriptedLLMServer, req: ModelRequest, tag: str
             ) -> tuple[Billed, list[ChatMessage], float]:
    """One 5-call tool turn: what it was billed, the messages it commits, its wall time."""
    llm.script.push(*[Reply(tool_calls=[ToolCallSpec("http_fetch", {"url": f"https://e.x/{i}"},
                                                     id=f"{tag}-{i}")], match=tag)
                      for i in range(STEPS - 1)], Reply("Here is what I found.", match=tag))
    t = time.perf_counter()
    messages, committed = list(req.messages), [req.messages[-1]]
    turn = provider.chat(req, lambda _: None)
    billed = Billed().add(turn, name)
    while turn.tool_calls:
        call = turn.tool_calls[0]
        page = f"Page {call.arguments['url']}: " + "archive text, " * 120
        done = [ChatMessage(role="assistant", content=turn.content, tool_calls=turn.tool_calls),
                ChatMessage(role="tool", tool_call_id=call.id, content=page)]
        messages += done
        committed += done
        turn = provider.continue_(turn.provider_state, done[1:], replace(req, messages=messages),
                                  lambda _: None)
        billed = billed.add(turn, name)
    committed.append(ChatMessage(role="assistant", content=turn.content))
    assert len(committed) == 2 * STEPS and not llm.script.pending, "the turn went off script"
    return billed, committed, time.perf_counter() - t


def conversation(llm: ScriptedLLMServer, name: str, after: bool
                 ) -> tuple[list[Billed], list[float]]:
    """Turns 1, 2 and 3 of one conversation, a day apart, on a clean cache."""
    llm.script.reset()
    route = ProviderRoute(name, name, f"scripted-{name}")  # type: ignore[arg-type]
    provider = adapter_for(route, Settings(prompt_cache=after))
    history: list[ChatMessage] = []
    billed, times = [], []
    for n in range(1, TURNS + 1):
        now = DAY1 + timedelta(days=n - 1, hours=n)
        text = f"Find the archive pages on topic {n} (turn-{n})."
        b, committed, t = run_turn(provider, name, llm,
                                   request(after, name, history, text, now, facts(n)), f"turn-{n}")
        history += committed
        billed.append(b)
        times.append(t)
    return billed, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    with ScriptedLLMServer() as llm:
        os.environ.update(ANTHROPIC_BASE_URL=llm.anthropic_base_url, ANTHROPIC_API_KEY="k",
                          OPENAI_BASE_URL=llm.openai_base_url, OPENAI_API_KEY="k")
        print("| provider | turn | layout | prompt tokens | uncached | cache writes | cache reads "
              "| billed input | vs before | turn ms median (min-max) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in ("anthropic", "openai"):
            runs = {after: [conversation(llm, name, after) for _ in range(a.repeat)]
                    for after in (False, True)}
            for i in range(TURNS):
                before_billed = runs[False][0][0][i].billed
                for after in (False, True):
                    billed = {r[0][i] for r in runs[after]}
                    assert len(billed) == 1, billed  # deterministic
                    b = billed.pop()
                    ms = [r[1][i] * 1000 for r in runs[after]]
                    print(f"| {name} | {i + 1} | {'after' if after else 'before'} | {b.prompt} "
                          f"| {b.uncached} | {b.written} | {b.read} | {b.billed:.0f} "
                          f"| {b.billed / before_billed:.0%} | {statistics.median(ms):.1f} "
                          f"({min(ms):.1f}-{max(ms):.1f}) |")


if __name__ == "__main__":
    main()
