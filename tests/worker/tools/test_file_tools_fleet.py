"""File tools never stall a worker: a catastrophic regex search in one conversation runs for
its whole time bound (2 s) while an unrelated turn on the same ``celery worker`` (gevent pool)
answers at its usual speed, well under a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_worker.tools.files.limits import SEARCH_REGEX_SECONDS
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import events, first_event, start, uniq, wait

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ws = tmp_path_factory.mktemp("files-fleet-ws")
    (ws / "a.txt").write_text(("a" * 60 + "b\n") * 5)
    env = {**provider_env(llm, "openai"), "FERMIX_WORKSPACE": str(ws),
           "FERMIX_RUNS__VERBOSE": "true"}  # tool results on the run stream
    s = start_stack("files-fleet", redis_url, 5, env, logs_dir, workers=1)
    yield s
    s.stop()


def test_a_catastrophic_search_does_not_delay_another_turn_on_the_same_worker(
    stack: Stack, llm: ScriptedLLMServer,
) -> None:
    slow, quick = uniq("search"), uniq("quick")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("search_files", {"pattern": "^(a|aa)+$"})], match=slow),
        Reply(text="that pattern is too slow", match=slow),
        Reply(text="pong", match=quick),
    )
    with stack.http() as http:
        searching = start(http, slow, uniq("chat"))
        began = first_event(http, searching, "tool")  # the search has started
        assert began["name"] == "search_files" and began["phase"] == "start", began
        sent = time.monotonic()
        answered = wait(http, start(http, quick, uniq("chat")), timeout=30)
        took = time.monotonic() - sent
        still = http.get(f"/v1/runs/{searching}").json()["status"]
        done = wait(http, searching, timeout=30)
    print(f"quick turn answered in {took:.3f} s while the search ran")
    assert answered["reply"] == "pong" and took < 1.0, took
    assert still == "running"  # the quick turn did not wait for the search to end
    assert done["status"] == "ok" and done["reply"] == "that pattern is too slow"
    result = next(e for e in events(stack.http(), searching)
                  if e[0] == "tool" and e[1]["phase"] == "result")[1]["result"]
    assert f"took longer than {SEARCH_REGEX_SECONDS:g} s" in result
