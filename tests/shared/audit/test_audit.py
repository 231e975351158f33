"""The audit chain: canonical encoding, sha256 in Lua, appends from many threads, verification
(tampering of every kind is named), retention that keeps the chain verifiable, failing open.

Pure parts run without Redis; the rest on the scratch redis-server (``r``)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fermix_dev.procs import free_port
from fermix_shared import audit, keys, metrics
from fermix_shared.audit import AuditConfig, AuditLog, BrokenAnchor, ChainPoint, verify
from fermix_shared.audit.chain import (
    GENESIS,
    body_of,
    canonical_json,
    entry_hash,
    link_hash,
    sha256_hex,
)
from fermix_shared.lua.script import FOLDER

WHO = audit.Who(actor="telegram:42", run_id="run_1", conv="telegram|42|root", agent="default")


def body(i: int = 0, **detail: Any) -> dict[str, Any]:
    return audit.make_body("tool", "calculator", "ok", WHO, {"ms": 0.5, "i": i, **detail})


def chain(n: int, start: ChainPoint | None = None) -> list[dict[str, Any]]:
    """``n`` entries as the append script writes them, built in Python."""
    prev = start or ChainPoint.origin()
    out = []
    for i in range(1, n + 1):
        seq, ts, b = prev.seq + 1, 1_700_000_000_000 + i, body(i)
        h = link_hash(prev.hash, seq, ts, sha256_hex(canonical_json(b)))
        out.append({"hash": h, "prev": prev.hash, "seq": seq, "ts": ts, **b})
        prev = ChainPoint(seq, h)
    return out


# --- canonical encoding (pure) ----------------------------------------------------------------

def test_canonical_json_is_sorted_compact_ascii_and_stable() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"z": "é✓😀", "y": ""}, "c": -0}
    text = canonical_json(value)
    assert text == ('{"a":{"y":"","z":"\\u00e9\\u2713\\ud83d\\ude00"},"b":[1,2.5,null,true],'
                    '"c":0}')
    # Read back and encoded again: the same text, so a stored entry always hashes the same.
    assert canonical_json(json.loads(text)) == text
    assert canonical_json(dict(reversed(list(value.items())))) == text
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_an_entry_s_hash_is_fixed_by_its_documented_formula() -> None:
    # A known vector: a later release that changes the encoding fails here, not in the field.
    b = audit.make_body("check", "run_command", "fail", WHO, {"reason": "no", "n": 1})
    assert canonical_json(b) == (
        '{"action":"run_command","actor":"telegram:42","agent":"default",'
        '"conv":"telegram|42|root","detail":{"n":1,"reason":"no"},"kind":"check",'
        '"outcome":"fail","run":"run_1","schema_version":1}')
    digest = hashlib.sha256(canonical_json(b).encode()).hexdigest()
    expected = hashlib.sha256(f"{GENESIS}\n1\n1700000000000\n{digest}".encode()).hexdigest()
    entry = {"hash": expected, "prev": GENESIS, "seq": 1, "ts": 1_700_000_000_000, **b}
    assert entry_hash(entry) == expected
    assert body_of(entry) == b


def test_detail_keeps_scalars_and_only_a_digest_of_long_text() -> None:
    long = "x" * 500
    b = audit.make_body("memory", "store", "ok", WHO, {"text": long, "n": 3, "none": None})
    assert b["detail"]["text"] == "sha256:" + sha256_hex(long)
    with pytest.raises(TypeError):
        audit.make_body("tool", "t", "ok", WHO, {"args": {"k": "v"}})
    with pytest.raises(ValueError):
        audit.make_body("tool", "t", "maybe", WHO, {})  # type: ignore[arg-type]


# --- verify (pure) ---------------------------------------------------------------------------

def test_a_whole_chain_verifies() -> None:
    entries = chain(5)
    result = verify(ChainPoint.origin(), [json.dumps(e) for e in entries],
                    ChainPoint(5, entries[-1]["hash"]))
    assert result.ok and (result.count, result.first, result.last) == (5, 1, 5)
    assert result.describe().startswith("audit chain OK: 5 entries from #1 to #5")
    assert verify(ChainPoint.origin(), []).describe() == "audit chain OK: 0 entries"


@pytest.mark.parametrize(("tamper", "seq", "problem"), [
    (lambda es: es[2]["detail"].update(i=99), 3, "hash mismatch"),
    (lambda es: es[2].update(outcome="error"), 3, "hash mismatch"),
    (lambda es: es[2].update(ts=es[2]["ts"] + 1), 3, "hash mismatch"),
    (lambda es: es[3].update(prev="f" * 64), 4, "prev mismatch"),
    (lambda es: es[3].update(seq=9), 4, "seq mismatch"),
    (lambda es: es.__setitem__(1, None), 2, "missing"),
    (lambda es: es.__setitem__(1, "{not json"), 2, "unreadable"),
    (lambda es: es.pop(1), 2, "seq mismatch"),
])
def test_any_edit_names_the_first_broken_entry(tamper: Any, seq: int, problem: str) -> None:
    entries: list[Any] = chain(6)
    tamper(entries)
    result = verify(ChainPoint.origin(), [json.dumps(e) if isinstance(e, dict) else e
                                          for e in entries])
    assert not result.ok and result.broken is not None
    assert (result.broken.seq, result.broken.problem) == (seq, problem)
    assert result.count == seq - 1
    assert result.describe().startswith(f"audit chain BROKEN at entry #{seq}: {problem}")


def test_a_cut_off_end_is_a_head_mismatch() -> None:
    entries = chain(4)
    result = verify(ChainPoint.origin(), [json.dumps(e) for e in entries[:3]],
                    ChainPoint(4, entries[-1]["hash"]))
    assert result.broken is not None and (result.broken.seq, result.broken.problem) == (
        4, "head mismatch")
    # The last entry rewritten with a hash that matches its new content: only the head knows.
    forged = {**entries[3], "outcome": "error"}
    forged["hash"] = entry_hash(forged)
    result = verify(ChainPoint.origin(), [json.dumps(e) for e in [*entries[:3], forged]],
                    ChainPoint(4, entries[3]["hash"]))
    assert result.broken is not None and (result.broken.seq, result.broken.problem) == (
        4, "head mismatch")
    assert "the end of the chain was rewritten" in result.describe()


# --- sha256 in Lua -----------------------------------------------------------------------------

def _lua_sha256(r: redis.Redis) -> Any:
    """The append script's sha256 function, run over each ARGV."""
    source = (FOLDER / "audit_append.lua").read_text()
    function = source.split('\nlocal head = redis.call("HMGET"')[0]
    assert "local function sha256(msg)" in function
    return r.register_script(function + "\nlocal out = {}\nfor i = 1, #ARGV do "
                             "out[i] = sha256(ARGV[i]) end\nreturn out\n")


def test_sha256_in_lua_equals_hashlib(scratch_redis_url: str) -> None:
    r = redis.Redis.from_url(scratch_redis_url)  # bytes in, bytes out
    rng = random.Random(16)
    inputs: list[bytes] = [b"", b"abc", b"a" * 55, b"a" * 56, b"a" * 63, b"a" * 64, b"a" * 65,
                           b"a" * 119, b"a" * 120, bytes(range(256)), b"\x00" * 100,
                           "héllo ✓ 😀 — ünïcödé".encode(), ("日本語" * 300).encode(),
                           os.urandom(1000), os.urandom(100_000)]
    inputs += [rng.randbytes(n) for n in range(0, 200)]
    inputs += [rng.randbytes(rng.randrange(200, 5000)) for _ in range(30)]
    script = _lua_sha256(r)
    got = script(args=inputs)
    assert [g.decode() for g in got] == [hashlib.sha256(x).hexdigest() for x in inputs]
    # The FIPS 180-2 two-block vector, by value.
    assert script(args=[b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"])[0] == (
        b"248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    r.close()


# --- appending in Redis ------------------------------------------------------------------------

def test_appends_chain_from_the_genesis_and_read_back_newest_first(r: redis.Redis) -> None:
    first = audit.record(r, "tool", "calculator", "ok", **WHO, ms=1.5)
    second = audit.record(r, "trust", "inbound", "fail", actor="telegram:9", conv="c")
    assert first is not None and second is not None
    assert (first.seq, second.seq) == (1, 2)
    stored = json.loads(str(r.hget(keys.audit_entries(), "1")))
    assert stored["prev"] == GENESIS and stored["hash"] == first.hash == entry_hash(stored)
    assert json.loads(str(r.hget(keys.audit_entries(), "2")))["prev"] == first.hash
    log = AuditLog(r)
    assert [e.seq for e in log.recent()] == [2, 1]
    assert [e.action for e in log.recent(run="run_1")] == ["calculator"]
    assert log.recent(agent="default")[0].detail == {"ms": 1.5}
    assert log.verify().describe().startswith("audit chain OK: 2 entries from #1 to #2")


def test_concurrent_appends_from_threads_form_one_valid_chain(scratch_redis_url: str,
                                                              r: redis.Redis) -> None:
    threads, each = 8, 150

    def append(n: int) -> None:
        client = redis.Redis.from_url(scratch_redis_url, decode_responses=True)
        for i in range(each):
            assert audit.record(client, "tool", f"t{n}", "ok", **WHO, i=i) is not None
        client.close()

    workers = [threading.Thread(target=append, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    result = AuditLog(r).verify()
    assert result.ok, result.describe()
    assert (result.count, result.first, result.last) == (threads * each, 1, threads * each)
    per_thread = [e.action for e in AuditLog(r).recent(limit=threads * each)]
    assert sorted(set(per_thread)) == [f"t{n}" for n in range(threads)]
    assert all(per_thread.count(f"t{n}") == each for n in range(threads))


def test_verify_in_redis_names_an_edited_entry(r: redis.Redis) -> None:
    for i in range(5):
        audit.record(r, "tool", "calculator", "ok", **WHO, i=i)
    raw = json.loads(str(r.hget(keys.audit_entries(), "3")))
    raw["actor"] = "telegram:666"
    r.hset(keys.audit_entries(), "3", json.dumps(raw))
    result = AuditLog(r).verify()
    assert result.broken is not None and (result.broken.seq, result.broken.problem) == (
        3, "hash mismatch")


# --- retention ---------------------------------------------------------------------------------

def test_trimming_by_count_moves_the_anchor_and_the_chain_still_verifies(r: redis.Redis) -> None:
    for i in range(100):
        audit.record(r, "tool", "calculator", "ok", **WHO, i=i)
    log = AuditLog(r)
    seventy = json.loads(str(r.hget(keys.audit_entries(), "70")))
    assert log.trim(AuditConfig(max_entries=30, max_age_days=0)) == 70
    assert log.anchor() == ChainPoint(70, seventy["hash"])
    assert r.hlen(keys.audit_entries()) == 30
    result = log.verify()
    assert result.ok and (result.count, result.first, result.last) == (30, 71, 100)
    assert "earlier ones trimmed (anchor #70)" in result.describe()
    audit.record(r, "tool", "calculator", "ok", **WHO)
    assert log.verify().last == 101
    assert log.trim(AuditConfig(max_entries=30, max_age_days=0)) == 1
    assert log.verify().ok


def test_trimming_by_age_and_everything(r: redis.Redis) -> None:
    for _ in range(10):
        audit.record(r, "tool", "calculator", "ok", **WHO)
    log = AuditLog(r)
    now = int(str(r.hget(keys.audit_head(), "ts")))
    assert log.trim(AuditConfig(max_entries=0, max_age_days=1), now_ms=now) == 0
    # A day later every entry is past the age limit: all go, the anchor is the head.
    dropped = log.trim(AuditConfig(max_entries=0, max_age_days=1), now_ms=now + 86_400_001)
    assert dropped == 10 and log.anchor() == log.head()
    assert log.verify().describe() == "audit chain OK: 0 entries, earlier ones trimmed (anchor #10)"
    audit.record(r, "tool", "calculator", "ok", **WHO)
    result = log.verify()
    assert result.ok and (result.first, result.last) == (11, 11)


def test_trimming_never_goes_past_a_missing_entry(r: redis.Redis) -> None:
    for _ in range(10):
        audit.record(r, "tool", "calculator", "ok", **WHO)
    r.hdel(keys.audit_entries(), "4")
    with pytest.raises(BrokenAnchor, match="entry #4"):
        AuditLog(r).trim(AuditConfig(max_entries=2, max_age_days=0))
    assert AuditLog(r).anchor().seq == 3  # 1-3 went, 4 is the evidence
    broken = AuditLog(r).verify().broken
    assert broken is not None and (broken.seq, broken.problem) == (4, "missing")


def test_retention_is_the_audit_table_of_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from fermix_shared.settings import Settings

    assert Settings(redis_url="x").audit == AuditConfig(max_entries=100_000, max_age_days=30)
    assert Settings(redis_url="x", audit={"max_entries": 5}).audit == AuditConfig(
        max_entries=5, max_age_days=30)
    monkeypatch.setenv("FERMIX_AUDIT__MAX_AGE_DAYS", "7")
    assert Settings(redis_url="x").audit == AuditConfig(max_entries=100_000, max_age_days=7)
    with pytest.raises(ValueError):
        AuditConfig(max_entries=-1)


# --- failing open ------------------------------------------------------------------------------

def test_a_failed_append_is_logged_and_counted_never_raised(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    before = metrics.AUDIT_WRITE_FAILURES.labels(kind="tool")._value.get()
    assert audit.record(down, "tool", "calculator", "ok", actor="worker") is None
    assert metrics.AUDIT_WRITE_FAILURES.labels(kind="tool")._value.get() == before + 1
    assert "could not record a tool entry; the action went ahead" in caplog.text
    # Without a recorder (a loop run by a unit test) nothing is recorded, nothing fails.
    from fermix_worker.tools.context import RunContext

    assert RunContext().audit.record("tool", "calculator", "ok") is None
