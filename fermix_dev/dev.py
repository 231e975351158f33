"""``fermix dev``: the whole stack on one machine with embedded defaults.

Starts (as needed) an embedded ``redis-server`` with AOF under ``$FERMIX_HOME/dev/redis``, the
built-in scripted model when no provider API key is configured, the gateway and one worker;
proves one turn answers, then starts beat and prints how to talk to the stack.

Fast on purpose (issue 18: the first answer within 3 s of the command on an idle, warm
install; stopped within 2 s of Ctrl-C):

- this process spawns before importing anything heavy (``fermix dev`` is parsed without the
  client commands' modules) and talks to the gateway with ``http.client``;

- the gateway and the worker start at once, while this process serves the scripted model
  from a thread (no interpreter of its own); the worker is ``python -m fermix_cli.worker``,
  which execs Celery without loading the whole CLI first, at niceness 10 (the gateway keeps
  priority, as in a same-host deployment);
- readiness is polled every few milliseconds: the gateway's ``/healthz`` and the worker's
  heartbeat in Redis, in one loop that fails as soon as either process exits;
- beat, which only ticks scheduled jobs, starts after the first answer (``--check`` never
  needs it), so it does not compete with the gateway and the worker for the CPU;
- stopping sends SIGTERM to every process at once and SIGKILL to any left after 1 s, then
  stops Redis (SIGTERM: it flushes its append-only file and exits at once). The gevent worker
  is usually the one killed: Celery's warm shutdown waits out two 2 s broker polls and a 1 s
  control poll, so this process marks it stopped in Redis as its own shutdown would have
  (a turn it held resumes at once on the next start).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from fermix_dev import embedded
from fermix_dev.procs import Managed, free_port, port_in_use, python_argv, stop_all, wait_until
from fermix_shared.errors import ConfigError
from fermix_shared.provider_routes import resolved_model, resolved_provider

if TYPE_CHECKING:
    from fermix_dev.scripted_llm import ScriptedLLMServer

# Re-exported: tests and the README quote it.
SCRIPTED_NOTICE = embedded.SCRIPTED_NOTICE
WORKER_NICE = 10
WORKER_NODE = "dev@%h"
STOP_GRACE_S = 1.0


def _say(text: str) -> None:
    print(f"[fermix dev] {text}", flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the stack as Ctrl-C does


@dataclass
class _Stack:
    """What this command started, to stop at the end."""

    procs: list[Managed] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the processes' environment
    worker: Managed | None = None
    redis_url: str = ""
    redis_server: embedded.EmbeddedRedis | None = None
    llm: ScriptedLLMServer | None = None

    def stop(self) -> None:
        """Every process at once (SIGKILL after STOP_GRACE_S), then Redis."""
        llm_stopping = None
        if self.llm is not None:  # meanwhile
            llm_stopping = threading.Thread(target=self.llm.stop, kwargs={"timeout": 1},
                                            daemon=True)
            llm_stopping.start()
        stop_all(self.procs, grace=STOP_GRACE_S)
        if self.worker is not None and self.worker.proc.returncode == -signal.SIGKILL:
            _mark_stopped(self.redis_url, self.worker)
        if self.redis_server is not None:
            self.redis_server.release()
        if llm_stopping is not None:
            llm_stopping.join(1)


def run_dev(host: str, port: int, concurrency: int, check_only: bool) -> int:
    started = time.monotonic()
    if port_in_use(port, host):
        raise ConfigError(f"port {port} is already in use; pass --port to pick another")
    stack = _Stack()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        gateway_url = _start(stack, host, port, concurrency)
        status, reply = _smoke_turn(gateway_url)
        if status != "ok":
            _say(f"smoke turn ended {status}: {reply}; stopping")
            return 1
        _say(f"smoke turn answered: {reply!r} ({time.monotonic() - started:.1f} s after start)")
        if check_only:
            _say("--check: stack works; shutting down")
            return 0
        # Beat fires scheduled jobs (fermix schedule add ...); RedBeat keeps its schedule in Redis.
        stack.procs.append(Managed("beat", python_argv("-m", "fermix_cli", "beat"),
                                   env=stack.env, log_path=_logs() / "beat.log"))
        _say("ready. In another terminal:")
        print(f"    FERMIX_GATEWAY_URL={gateway_url} .venv/bin/fermix agent -m 'what time is it?'")
        print(f"    curl -s -XPOST {gateway_url}/v1/agent -H 'content-type: application/json' "
              "-d '{\"message\":\"hi\"}'")
        print("  Ctrl-C stops everything.", flush=True)
        return _watch(stack.procs)
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C or SIGTERM must not cut the stopping short (it takes under 2 s).
        interrupts = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopping = time.monotonic()
        stack.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, interrupts)
        if stack.procs:
            _say(f"stopped in {time.monotonic() - stopping:.1f} s")
        sys.stdout.flush()


def _logs() -> Path:
    return embedded.fermix_home() / "dev" / "logs"


def _start(stack: _Stack, host: str, port: int, concurrency: int) -> str:
    """Redis, then the gateway and the worker at once and the scripted model meanwhile; until
    both answer. Returns the gateway's URL."""
    home, logs = embedded.fermix_home(), _logs()
    logs.mkdir(parents=True, exist_ok=True)
    env = stack.env = dict(os.environ)
    configured = embedded.configured_redis_url()
    if configured is None:
        stack.redis_server = embedded.acquire(home / "dev" / "redis", "dev",
                                              log_path=logs / "redis.log", on_wait=_say)
        env["FERMIX_REDIS_URL"] = stack.redis_url = stack.redis_server.url
        _say(f"embedded Redis (AOF on) at {stack.redis_url}, data in {home / 'dev' / 'redis'}")
    else:
        stack.redis_url = configured
        _say(f"using Redis at {embedded.redact_url(configured)}")
    scripted = embedded.needs_scripted_model(env)
    llm_port = free_port() if scripted else 0
    if scripted:
        env.update(embedded.scripted_model_env(f"http://127.0.0.1:{llm_port}/v1"))
    gateway_url = f"http://{host}:{port}"
    env["FERMIX_GATEWAY_URL"] = gateway_url
    gw = Managed("gateway", python_argv("-m", "fermix_cli", "gateway", "--host", host,
                                        "--port", str(port)),
                 env=env, log_path=logs / "gateway.log")
    stack.procs.append(gw)
    stack.worker = Managed("worker", python_argv("-m", "fermix_cli.worker", "--concurrency",
                                                 str(concurrency), "--name", WORKER_NODE,
                                                 "--nice", str(WORKER_NICE)),
                           env=env, log_path=logs / "worker.log")
    stack.procs.append(stack.worker)
    if scripted:
        # Served from here while the gateway and the worker import (they call it later).
        from fermix_dev.scripted_llm import ScriptedLLMServer

        stack.llm = ScriptedLLMServer(port=llm_port).start()
        _say(SCRIPTED_NOTICE)
    else:
        from fermix_shared.settings import Settings

        s = Settings()
        _say(f"provider: {resolved_provider(s)}, model: {resolved_model(s)}")
    _wait_ready(gateway_url, stack.redis_url, gw, stack.worker)
    _say(f"gateway at {gateway_url}, worker at nice {WORKER_NICE} (logs in {logs})")
    return gateway_url


def _wait_ready(gateway_url: str, redis_url: str, gw: Managed, worker: Managed) -> None:
    """Until the gateway answers ``/healthz`` and the worker's heartbeat is in Redis (it is
    written once the worker has warmed up and consumes)."""
    import http.client
    from urllib.parse import urlsplit

    import redis

    from fermix_shared import keys

    r = redis.Redis.from_url(redis_url, socket_timeout=1, decode_responses=True)
    gw_at = urlsplit(gateway_url)
    state = {"gateway": False, "worker": False}

    def healthz() -> bool:
        conn = http.client.HTTPConnection(gw_at.hostname or "127.0.0.1", gw_at.port, timeout=1)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    def worker_beats() -> bool:
        beats: dict[str, str] = r.hgetall(keys.workers())  # type: ignore[assignment]
        return any(node.startswith(WORKER_NODE.split("%")[0]) and float(seen) >= worker.started_at
                   for node, seen in beats.items())

    def ready() -> bool:
        state["gateway"] = state["gateway"] or healthz()
        state["worker"] = state["worker"] or worker_beats()
        return state["gateway"] and state["worker"]

    try:
        wait_until(ready, 60, "the gateway and the worker", watch=[gw, worker])
    except TimeoutError:
        late = " and ".join(k for k, v in state.items() if not v)
        raise ConfigError(f"the {late} did not start within 60 s; see its log") from None
    except RuntimeError as e:
        raise ConfigError(f"{e}; see its log") from None
    finally:
        r.close()


def _smoke_turn(gateway_url: str) -> tuple[str, str]:
    """One turn through the gateway's run API (``POST /v1/agent``, then ``wait``): its status
    and its reply (or error). Plain ``http.client``: the HTTP client library and the settings
    would cost this process half a second of CPU while the worker needs it to start."""
    import http.client
    import json
    from urllib.parse import urlsplit

    at = urlsplit(gateway_url)
    token = embedded.configured("api_token")
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(at.hostname or "127.0.0.1", at.port, timeout=70)

    def call(method: str, path: str, body: dict[str, str] | None = None) -> dict[str, str]:
        conn.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        resp = conn.getresponse()
        answer = json.loads(resp.read() or b"{}")
        if resp.status >= 400:
            raise ConfigError(f"the gateway refused the smoke turn (HTTP {resp.status}): "
                              f"{answer.get('error') or answer.get('detail')}")
        return answer  # type: ignore[no-any-return]

    try:
        run_id = call("POST", "/v1/agent", {"message": "hello", "chatId": "dev-smoke"})["runId"]
        call("GET", f"/v1/runs/{run_id}/wait?timeout=60")
        record = call("GET", f"/v1/runs/{run_id}")
    finally:
        conn.close()
    status = str(record.get("status"))
    return status, str(record.get("reply") if status == "ok" else record.get("error"))


def _mark_stopped(redis_url: str, worker: Managed) -> None:
    """What the worker's warm shutdown says last (``Heartbeat.mark_stopped``): its beat is 0
    and its node is gone from the workers seen."""
    import redis

    from fermix_shared import keys

    r = redis.Redis.from_url(redis_url, socket_timeout=1, decode_responses=True)
    try:
        names: list[str] = r.hkeys(keys.worker_beats())  # type: ignore[assignment]
        for name in names:  # runtime.worker_name: node:pid:nonce
            node, _, rest = name.partition(":")
            if node.startswith(WORKER_NODE.split("%")[0]) and rest.startswith(f"{worker.pid}:"):
                r.hset(keys.worker_beats(), name, 0)
                r.hdel(keys.workers(), node)
    except redis.RedisError:
        pass  # the beat goes stale instead: the dead threshold frees its turns
    finally:
        r.close()


def _watch(procs: list[Managed]) -> int:
    """Until Ctrl-C or SIGTERM (0), or a process of the stack exits (1)."""
    while True:
        time.sleep(0.5)  # Ctrl-C and SIGTERM interrupt it
        for p in procs:
            if p.proc.poll() is not None:
                _say(f"{p.name} exited with code {p.proc.returncode}; stopping")
                return 1
    return 0
