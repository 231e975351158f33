"""The embedded Redis of a FERMIX_HOME: one redis-server per data directory, shared with a
running ``fermix dev``, never two at once (their append-only files would clash)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fermix_dev import embedded
from fermix_dev.embedded import EmbeddedRedis
from fermix_shared.errors import ConfigError


@pytest.fixture
def held() -> Iterator[list[EmbeddedRedis]]:
    """Every acquired server is released at the end, whatever the test did."""
    acquired: list[EmbeddedRedis] = []
    yield acquired
    for e in reversed(acquired):
        e.release()


def answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


def test_local_shares_a_running_dev_redis_and_a_second_dev_is_refused(
    tmp_path: Path, held: list[EmbeddedRedis]
) -> None:
    data = tmp_path / "redis"
    dev = embedded.acquire(data, "dev")
    held.append(dev)
    redis.Redis.from_url(dev.url).set("written-by-dev", "1")

    local = embedded.acquire(data, "local")
    held.append(local)
    assert local.shared and local.url == dev.url
    assert redis.Redis.from_url(local.url).get("written-by-dev") == b"1"
    local.release()  # not its server: it keeps running for dev
    assert answers(dev.url)

    with pytest.raises(ConfigError, match=r"another `fermix dev` \(pid \d+\) is running"):
        embedded.acquire(data, "dev")

    dev.release()
    assert not answers(dev.url)
    assert any(data.rglob("*.aof*")), "the embedded Redis keeps an append-only file"


def test_a_command_waits_for_a_local_turn_then_starts_its_own(
    tmp_path: Path, held: list[EmbeddedRedis]
) -> None:
    data = tmp_path / "redis"
    first = embedded.acquire(data, "local")
    held.append(first)
    told: list[str] = []
    waiting = threading.Event()

    def on_wait(text: str) -> None:
        told.append(text)
        waiting.set()

    with pytest.raises(ConfigError, match="stayed busy"):
        embedded.acquire(data, "dev", wait_s=0.2, on_wait=on_wait)
    assert told and "waiting for another fermix command" in told[0]

    waiting.clear()
    releaser = threading.Thread(target=lambda: waiting.wait(10) and first.release())
    releaser.start()
    second = embedded.acquire(data, "dev", on_wait=on_wait)  # waits until `first` is done
    held.append(second)
    releaser.join()
    assert not second.shared and second.url != first.url and answers(second.url)
    assert not answers(first.url)


def test_a_server_left_by_a_killed_owner_is_flushed_and_replaced(
    tmp_path: Path, held: list[EmbeddedRedis]
) -> None:
    data = tmp_path / "redis"
    orphaned = embedded.acquire(data, "dev")
    held.append(orphaned)
    redis.Redis.from_url(orphaned.url).set("kept", "yes")
    assert orphaned._lock is not None
    orphaned._lock.close()  # its owner died: the lock went with it, the server did not
    orphaned._lock = None

    fresh = embedded.acquire(data, "local")
    held.append(fresh)
    assert orphaned.proc is not None and orphaned.proc.proc.wait(5) == 0  # shut down cleanly
    assert redis.Redis.from_url(fresh.url).get("kept") == b"yes"  # from the flushed AOF


def test_the_configured_redis_is_the_environments_then_the_config_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FERMIX_REDIS_URL", raising=False)
    monkeypatch.delenv("FERMIX_CONFIG", raising=False)
    assert embedded.configured_redis_url() is None  # then the embedded one

    toml = tmp_path / "fermix.toml"
    toml.write_text('redis_url = "redis://10.0.0.5:6379/2"\n')
    monkeypatch.setenv("FERMIX_CONFIG", str(toml))
    assert embedded.configured_redis_url() == "redis://10.0.0.5:6379/2"
    monkeypatch.setenv("FERMIX_REDIS_URL", "redis://127.0.0.1:7000/0")
    assert embedded.configured_redis_url() == "redis://127.0.0.1:7000/0"  # as in Settings

    monkeypatch.delenv("FERMIX_REDIS_URL")
    toml.write_text("redis_url = [")
    with pytest.raises(ConfigError, match="cannot be read"):
        embedded.configured_redis_url()


def test_a_url_shown_to_the_user_has_no_password() -> None:
    assert embedded.redact_url("redis://:s3cret@10.0.0.5:6380/1") == "redis://:***@10.0.0.5:6380/1"
    assert embedded.redact_url("redis://u:s3cret@h/0") == "redis://u:***@h/0"
    assert embedded.redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
