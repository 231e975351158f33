"""The Lua scripts: declared once with named KEYS and ARGV, run by EVALSHA, reloaded when the
server forgot them (restart, failover, SCRIPT FLUSH), from sync and asyncio clients, and sent
with their bodies (EVAL) from pipelines."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from fermix_shared import lua
from fermix_shared.channels.ratelimit import RateLimiter
from fermix_shared.lua.script import FOLDER, LuaScript
from fermix_shared.memory.store import MemoryStore

# --- declarations and files -------------------------------------------------------------------

HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.)?\] (\w+): ", re.MULTILINE)


def _code(script: LuaScript) -> str:
    """The body without comments (a header names indexes the body may not use)."""
    return re.sub(r"--.*", "", script.source)


def _fixed(names: tuple[str, ...]) -> int:
    return sum(not n.startswith("*") for n in names)


def test_every_lua_file_is_declared_once() -> None:
    names = [s.name for s in lua.SCRIPTS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(p.stem for p in FOLDER.glob("*.lua"))


@pytest.mark.parametrize("script", lua.SCRIPTS, ids=lambda s: s.name)
def test_the_body_reads_no_index_beyond_its_declaration(script: LuaScript) -> None:
    code = _code(script)
    for table, names in (("KEYS", script.keys), ("ARGV", script.args)):
        used = {int(n) for n in re.findall(rf"{table}\[(\d+)\]", code)}
        # Every fixed name is read, and nothing past them except through the variadic tail.
        assert used == set(range(1, _fixed(names) + 1)), (table, sorted(used))
        dynamic = re.search(rf"#{table}\b|{table}\[(?!\d+\])|unpack\(\s*{table}\b", code)
        variadic = bool(names) and names[-1].startswith("*")
        assert bool(dynamic) == variadic, table


@pytest.mark.parametrize("script", lua.SCRIPTS, ids=lambda s: s.name)
def test_the_header_names_keys_and_argv_as_declared(script: LuaScript) -> None:
    for table, names in (("KEYS", script.keys), ("ARGV", script.args)):
        rows = [(int(i), bool(tail), name) for t, i, tail, name in HEADER.findall(script.source)
                if t == table]
        expected = [(n, name.startswith("*"), name.removeprefix("*"))
                    for n, name in enumerate(names, 1)]
        assert rows == expected, table


# --- naming ----------------------------------------------------------------------------------

FINISH_VALUES: dict[str, Any] = {
    "active": "a", "inbox": "i", "run": "r", "history": "h", "active_index": "ai",
    "queued_index": "qi", "steer": "s", "last_active": "la", "turn_id": "t1", "worker": "w", "record": "{}",
    "run_ttl_s": 60, "history_cap": 100, "conv": "c", "now_ms": 5, "mode": "close",
    "entries": ["e1", "e2"],
}


def test_names_become_keys_and_argv_in_the_declared_order() -> None:
    keys, args = lua.FINISH.bind(FINISH_VALUES)
    assert keys == ["a", "i", "r", "h", "ai", "qi", "s", "la"]
    assert args == ["t1", "w", "{}", 60, 100, "c", 5, "close", "e1", "e2"]
    assert lua.RATE_LIMIT.bind({"limits": ("x", "y"), "now_ms": 7, "intervals_ms": [10, 20]}) == (
        ["x", "y"], [7, 10, 20])


@pytest.mark.parametrize(("change", "message"), [
    ({"worker": None}, "missing worker"),
    ({"worker": None, "mode": None}, "missing mode, worker"),
    ({"wroker": "w"}, "unknown wroker"),
    ({"history_cap": [1, 2]}, "history_cap takes one value, not list"),
    ({"entries": "e1"}, "entries takes a list"),
    ({"inbox": 3}, "a key is a string, not 3"),
])
def test_a_missing_unknown_or_misshaped_name_is_refused_before_redis(
    change: dict[str, Any], message: str
) -> None:
    values = {k: v for k, v in {**FINISH_VALUES, **change}.items() if v is not None}
    nowhere = redis.Redis(port=1, socket_connect_timeout=0.1)  # never connected to
    with pytest.raises(TypeError, match=re.escape(message)):
        lua.FINISH(nowhere, **values)
    with pytest.raises(TypeError, match=re.escape(message)):
        lua.FINISH(aioredis.Redis(port=1), **values)


def test_declarations_refuse_repeated_names_and_an_inner_variadic() -> None:
    with pytest.raises(ValueError, match="used twice"):
        LuaScript("x", keys=("inbox",), args=("inbox",))
    with pytest.raises(ValueError, match="only the last"):
        LuaScript("x", keys=("*a", "b"), args=())


# --- running ---------------------------------------------------------------------------------

def _calls(r: redis.Redis, command: str, field: str = "calls") -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get(field, 0))


def _loads(r: redis.Redis) -> int:
    """SCRIPT LOADs since the last CONFIG RESETSTAT (Redis 6 counts SCRIPT as one command)."""
    return _calls(r, "script|load") or _calls(r, "script")


def _push(client: Any, n: int) -> Any:
    return lua.PUSH_FRONT(client, inbox="inbox", queued_index="queued", message=f"m{n}",
                          conv="c", now_ms=n)


def test_stores_run_scripts_by_sha_and_load_each_once(r: redis.Redis) -> None:
    r.script_flush()
    r.config_resetstat()
    limiter = RateLimiter(r, sleep=lambda _s: None)
    memory = MemoryStore(r)
    for i in range(3):
        limiter.acquire([("chat", 0.0)])
        memory.add(f"fact {i}", "test")
    assert [f.text for f in memory.active()] == ["fact 0", "fact 1", "fact 2"]
    assert _calls(r, "eval") == 0
    assert _loads(r) == 2  # once per script, after its first EVALSHA met NOSCRIPT
    assert _calls(r, "evalsha") == 6 + 2
    assert _calls(r, "evalsha", "failed_calls") == 2


def test_a_flushed_script_cache_is_reloaded(r: redis.Redis) -> None:
    assert _push(r, 1) == 1
    r.script_flush()  # what a restarted or failed-over server knows: nothing
    r.config_resetstat()
    assert _push(r, 2) == 2
    assert _push(r, 3) == 3
    assert r.lrange("inbox", 0, -1) == ["m3", "m2", "m1"]
    assert _loads(r) == 1
    assert _calls(r, "eval") == 0


@pytest.mark.parametrize("transaction", [True, False])
def test_a_pipeline_sends_its_scripts_bodies_and_no_script_check(r: redis.Redis,
                                                                 transaction: bool) -> None:
    """A pipeline is one round trip even when it holds a script the server forgot: the body
    goes along (EVAL), so no SCRIPT EXISTS or SCRIPT LOAD runs before it."""
    r.script_flush()
    r.config_resetstat()
    with r.pipeline(transaction=transaction) as pipe:
        _push(pipe, 1)
        _push(pipe, 2)
        assert pipe.execute() == [1, 2]
    assert r.lrange("inbox", 0, -1) == ["m2", "m1"]
    assert _calls(r, "eval") == 2
    assert _calls(r, "script|exists") == _calls(r, "script") == _loads(r) == 0
    assert _push(r, 3) == 3  # and EVALSHA outside a pipeline finds the body EVAL left
    assert _loads(r) == 0


def test_asyncio_clients_await_the_same_scripts(r: redis.Redis, scratch_redis_url: str) -> None:
    async def run() -> list[Any]:
        client = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
        try:
            first = await _push(client, 1)
            await client.script_flush()
            return [first, await _push(client, 2)]
        finally:
            await client.aclose()

    r.script_flush()
    r.config_resetstat()
    assert asyncio.run(run()) == [1, 2]
    assert r.lrange("inbox", 0, -1) == ["m2", "m1"]
    assert _calls(r, "eval") == 0
    # Each call met NOSCRIPT once (an empty cache, then a flushed one), loaded and retried.
    assert _calls(r, "evalsha") == 4
    assert _calls(r, "evalsha", "failed_calls") == 2
