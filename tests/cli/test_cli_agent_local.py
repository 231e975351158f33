"""``fermix agent --local``: one turn in the CLI process, through the same queue, history and
claim as a worker's, against the configured Redis or the embedded one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import redis

from fermix_dev.procs import free_port, start_redis
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_shared import keys
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage, RunRecord, RunStatus
from fermix_shared.stores import queue, runs
from tests.conftest import provider_env

BUSY_NOTE = "the chat is busy"


def local_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FERMIX_REDIS_URL"}
    return {**env, "FERMIX_HOME": str(home), **extra}


def fermix_local(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fermix_cli", "agent", "--local", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def history(r: redis.Redis, conv: str) -> list[tuple[str, str]]:
    raw: list[str] = r.lrange(keys.history(conv), 0, -1)  # type: ignore[assignment]
    return [(m.role, m.content) for m in map(ChatMessage.model_validate_json, raw)]


def test_a_local_turn_answers_with_the_built_in_model_in_the_embedded_redis(
    tmp_path: Path,
) -> None:
    out = fermix_local(local_env(tmp_path), "-m", "hello")

    assert out.returncode == 0, out.stderr
    assert out.stdout == 'Scripted reply: you said "hello"\n'
    assert "using the BUILT-IN SCRIPTED MODEL" in out.stderr
    assert f"using the embedded Redis in {tmp_path / 'dev' / 'redis'}" in out.stderr
    # Its redis-server was stopped with the command; the history is in its append-only file.
    data = tmp_path / "dev" / "redis"
    assert not (data / "owner.json").exists()
    proc, url = start_redis(data)
    try:
        r = redis.Redis.from_url(url, decode_responses=True)
        assert history(r, "http|default|root") == [
            ("user", "hello"), ("assistant", 'Scripted reply: you said "hello"')]
    finally:
        proc.stop()


def test_a_second_local_turn_in_the_chat_sees_the_first(
    r: redis.Redis, scratch_redis_url: str, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    llm.script.reset()
    env = local_env(tmp_path, FERMIX_REDIS_URL=scratch_redis_url, **provider_env(llm, "openai"))

    first = fermix_local(env, "-m", "my name is Ada", "--chat", "c7")
    second = fermix_local(env, "-m", "what is my name?", "--chat", "c7")

    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert first.stdout == 'Scripted reply: you said "my name is Ada"\n'
    assert "SCRIPTED MODEL" not in first.stderr  # a configured provider: no notice
    asked = [m for m in llm.script.requests[-1]["body"]["messages"] if m["role"] != "system"]
    assert [(m["role"], m["content"]) for m in asked[:2]] == [
        ("user", "my name is Ada"), ("assistant", 'Scripted reply: you said "my name is Ada"')]
    assert asked[-1]["role"] == "user" and asked[-1]["content"].endswith("what is my name?")
    assert history(r, "http|c7|root") == [
        ("user", "my name is Ada"), ("assistant", 'Scripted reply: you said "my name is Ada"'),
        ("user", "what is my name?"), ("assistant", 'Scripted reply: you said "what is my name?"'),
    ]


def test_a_local_turn_waits_while_a_worker_holds_the_chat_then_runs_after_it(
    r: redis.Redis, scratch_redis_url: str, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    chat = uuid.uuid4().hex[:8]
    key = ConversationKey(channel="http", chat_id=chat)
    conv = key.as_str()
    earlier = InboundMessage(key=key, text="earlier")
    assert queue.accept(r, earlier).new
    claim, lease = queue.claim(r, conv, "w-elsewhere:1:abc", 60)  # a worker's turn, running
    assert claim.kind == "claimed" and lease is not None
    env = local_env(tmp_path, FERMIX_REDIS_URL=scratch_redis_url, **provider_env(llm, "openai"))

    proc = subprocess.Popen([sys.executable, "-m", "fermix_cli", "agent", "--local",
                             "-m", "later", "--chat", chat],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        note = ""
        while BUSY_NOTE not in note:  # said once its message is queued and the claim refused
            note = proc.stderr.readline()
            assert note, "the command ended without waiting for the chat"
        waiting = [InboundMessage.model_validate_json(m)
                   for m in r.lrange(keys.inbox(conv), 0, -1)]  # type: ignore[union-attr]
        assert [m.text for m in waiting] == ["later"]
        assert r.hget(keys.active(conv), "turn_id") == earlier.run_id

        done = RunRecord(run_id=earlier.run_id, conversation=key, status=RunStatus.ok,
                         reply="earlier answer")
        entries = [ChatMessage(role="user", content="earlier").model_dump_json(),
                   ChatMessage(role="assistant", content="earlier answer").model_dump_json()]
        lease.finish(done, entries, 100, deliver=True)  # the worker's turn ends
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert stdout == 'Scripted reply: you said "later"\n'
    assert history(r, conv) == [("user", "earlier"), ("assistant", "earlier answer"),
                                ("user", "later"), ("assistant", 'Scripted reply: you said "later"')]
    record = runs.get(r, waiting[0].run_id)
    assert record is not None and record.worker is not None
    assert record.worker.startswith("local-")  # this process ran it, as a worker would


def test_an_unreachable_configured_redis_is_one_sentence_and_no_embedded_one(
    tmp_path: Path,
) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    out = fermix_local(local_env(tmp_path, FERMIX_REDIS_URL=url), "-m", "hello")

    assert out.returncode == 1 and out.stdout == ""
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("fermix: cannot reach Redis at redis://:***@127.0.0.1:"), last
    assert "unset FERMIX_REDIS_URL to use the embedded Redis" in last
    assert "hunter2" not in out.stderr
    assert not (tmp_path / "dev" / "redis").exists()  # a configured Redis is never swapped


def test_a_bad_chat_id_is_refused_with_exit_2(tmp_path: Path, scratch_redis_url: str) -> None:
    out = fermix_local(local_env(tmp_path, FERMIX_REDIS_URL=scratch_redis_url),
                       "-m", "hi", "--chat", "two words")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "fermix: --chat: 1-200 characters without spaces or '|', not 'two words'")
