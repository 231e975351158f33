"""The embedded defaults of one machine: the Redis under ``$FERMIX_HOME/dev/redis`` and the
built-in scripted model. Shared by ``fermix dev`` and ``fermix agent --local``.

One ``redis-server`` at most serves a data directory (two writing one append-only file would
corrupt it). Whoever starts it holds an exclusive lock on ``owner.lock`` in the directory for
as long as it runs it and records who it is in ``owner.json``; a second command finds the lock
taken and then:

- ``fermix agent --local`` beside a running ``fermix dev`` uses dev's Redis (the same history
  and queue as dev's worker);
- anything beside a running ``fermix agent --local`` waits for it to finish (a turn), then
  starts its own;
- a second ``fermix dev`` on the same ``FERMIX_HOME`` is refused.

A ``redis-server`` left behind by a killed owner (the lock went with its process) is shut down
(its append-only file flushed) before a new one starts on the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from fermix_dev.procs import Managed, free_port, start_redis
from fermix_shared.errors import ConfigError

Owner = Literal["dev", "local"]

SCRIPTED_NOTICE = (
    "No provider API key found (ANTHROPIC_API_KEY / OPENAI_API_KEY): using the BUILT-IN SCRIPTED "
    "MODEL. Replies are canned, not from a real LLM."
)
SCRIPTED_MODEL = "fermix-scripted"


def fermix_home() -> Path:
    """``$FERMIX_HOME``, else ``~/.fermix`` (what Settings resolves, without loading them)."""
    return Path(os.environ.get("FERMIX_HOME") or Path.home() / ".fermix")


def configured(key: str) -> str | None:
    """A plain setting (``redis_url``, ``api_token``) as Settings' own sources give it:
    ``FERMIX_<KEY>``, which wins, then ``<key>`` in the ``FERMIX_CONFIG`` file; None when
    neither sets it. Without loading Settings, which ``fermix dev`` would pay for (half a
    second of CPU) before it starts any process."""
    env_name = f"FERMIX_{key}".upper()
    for name, value in os.environ.items():
        if name.upper() == env_name and value:
            return value
    config = os.environ.get("FERMIX_CONFIG")
    if not config:
        return None
    import tomllib

    try:
        with open(config, "rb") as fh:
            found = tomllib.load(fh).get(key)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"FERMIX_CONFIG {config} cannot be read: {e}") from e
    return found if isinstance(found, str) and found else None


def configured_redis_url() -> str | None:
    """The Redis the configuration names, or None: then the embedded one is used."""
    return configured("redis_url")


def redact_url(url: str) -> str:
    """``url`` without its password, for the terminal and logs."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    return parts._replace(netloc=netloc + (f":{parts.port}" if parts.port else "")).geturl()


def needs_scripted_model(env: dict[str, str] | os._Environ[str]) -> bool:
    """No provider key configured: the embedded stack answers with the scripted model."""
    return not env.get("ANTHROPIC_API_KEY") and not env.get("OPENAI_API_KEY")


def scripted_model_env(openai_base_url: str) -> dict[str, str]:
    """The variables that route every turn to the scripted model at ``openai_base_url`` (and
    price it at $0, which it costs, so usage accounting does not warn about it)."""
    return {"OPENAI_BASE_URL": openai_base_url, "OPENAI_API_KEY": "scripted-model-no-key",
            "FERMIX_PROVIDER": "openai", "FERMIX_MODEL": SCRIPTED_MODEL,
            "FERMIX_PRICES": json.dumps({SCRIPTED_MODEL: {"input": 0, "output": 0}})}


@dataclass
class EmbeddedRedis:
    """The embedded Redis a command uses: ``url``, and ``proc`` when this command started it
    (and must stop it: :meth:`release`)."""

    url: str
    data_dir: Path
    proc: Managed | None = None
    _lock: IO[str] | None = field(default=None, repr=False)

    @property
    def shared(self) -> bool:
        """Someone else's (a running ``fermix dev``)."""
        return self.proc is None

    def release(self) -> None:
        """Stop the server if this command started it, then give up the directory."""
        if self.proc is not None:
            self.proc.stop(timeout=5)
            self.proc = None
        if self._lock is not None:
            with contextlib.suppress(OSError):
                (self.data_dir / "owner.json").unlink()
            self._lock.close()  # releases the lock
            self._lock = None


def _read_owner(data_dir: Path) -> dict[str, object]:
    try:
        owner = json.loads((data_dir / "owner.json").read_text())
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _serving(url: str, data_dir: Path) -> bool:
    """Whether a redis-server answers at ``url`` with ``data_dir`` as its directory."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
    try:
        served = client.config_get("dir").get("dir")
        return bool(served) and Path(str(served)).resolve() == data_dir.resolve()
    except redis.RedisError:
        return False
    finally:
        client.close()


def _shutdown_leftover(data_dir: Path) -> None:
    """A server whose owner was killed still runs on the directory: flush and stop it."""
    import redis

    url = _read_owner(data_dir).get("url")
    if not isinstance(url, str) or not _serving(url, data_dir):
        return
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=5)
    with contextlib.suppress(redis.RedisError):  # SHUTDOWN closes the connection: expected
        client.shutdown()
    client.close()


def _try_lock(path: Path) -> IO[str] | None:
    fh = open(path, "a+")  # noqa: SIM115 (held for the server's lifetime)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def acquire(data_dir: Path, owner: Owner, *, log_path: Path | None = None,
            wait_s: float = 900.0,
            on_wait: Callable[[str], None] | None = None) -> EmbeddedRedis:
    """The embedded Redis for ``data_dir`` (see the module docstring for who shares what).

    ``on_wait`` is told once, in a sentence, when this command has to wait for
    another one. Raises ConfigError for a second ``fermix dev`` or when the wait runs out.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        lock = _try_lock(data_dir / "owner.lock")
        if lock is not None:
            _shutdown_leftover(data_dir)
            # Say who we are before the server answers: a command that finds the lock taken
            # waits until the url below serves this directory.
            port = free_port()
            url = f"redis://127.0.0.1:{port}/0"
            (data_dir / "owner.json").write_text(
                json.dumps({"owner": owner, "pid": os.getpid(), "url": url}))
            try:
                proc, url = start_redis(data_dir, port=port, log_path=log_path)
            except BaseException:
                EmbeddedRedis(url, data_dir, None, lock).release()
                raise
            return EmbeddedRedis(url, data_dir, proc, lock)
        holder = _read_owner(data_dir)
        held_url, pid = holder.get("url"), holder.get("pid")
        if holder.get("owner") == "dev":
            if owner == "dev":
                raise ConfigError(
                    f"another `fermix dev` (pid {pid}) is running with the embedded Redis in "
                    f"{data_dir}; stop it first, or set FERMIX_HOME to another directory")
            if isinstance(held_url, str) and _serving(held_url, data_dir):
                return EmbeddedRedis(held_url, data_dir)
        if time.monotonic() >= deadline:
            raise ConfigError(f"the embedded Redis in {data_dir} stayed busy for {wait_s:g} s "
                              f"(held by pid {pid})")
        if not told and on_wait is not None:
            on_wait(f"waiting for another fermix command (pid {pid}) that is using the "
                    f"embedded Redis in {data_dir}")
            told = True
        time.sleep(0.1)  # flock has no timeout, and the holder may change: look again
