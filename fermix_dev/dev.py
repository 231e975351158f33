"""``fermix dev``: the whole stack on one machine with embedded defaults.

Starts (as needed) an embedded ``redis-server`` with AOF under ``$FERMIX_HOME/dev/redis``, the
built-in scripted model when no provider API key is configured, the gateway, one worker and
beat; then
proves one turn answers and prints how to talk to the stack.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import redis

from fermix_cli.client import run_agent
from fermix_dev.procs import (
    Managed,
    free_port,
    port_in_use,
    python_argv,
    start_redis,
    wait_until,
)
from fermix_shared import keys
from fermix_shared.errors import ConfigError
from fermix_shared.settings import Settings

SCRIPTED_NOTICE = (
    "No provider API key found (ANTHROPIC_API_KEY / OPENAI_API_KEY): using the BUILT-IN SCRIPTED "
    "MODEL. Replies are canned, not from a real LLM."
)


def _say(text: str) -> None:
    print(f"[fermix dev] {text}", flush=True)


def run_dev(host: str, port: int, concurrency: int, check_only: bool) -> int:
    if port_in_use(port, host):
        raise ConfigError(f"port {port} is already in use; pass --port to pick another")
    home = Path(os.environ.get("FERMIX_HOME") or Path.home() / ".fermix")
    logs = home / "dev" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    procs: list[Managed] = []
    try:
        if not env.get("FERMIX_REDIS_URL"):
            rproc, url = start_redis(home / "dev" / "redis", log_path=logs / "redis.log")
            procs.append(rproc)
            env["FERMIX_REDIS_URL"] = url
            _say(f"embedded Redis (AOF on) at {url}, data in {home / 'dev' / 'redis'}")
        else:
            _say(f"using Redis at {env['FERMIX_REDIS_URL']}")
        if not env.get("ANTHROPIC_API_KEY") and not env.get("OPENAI_API_KEY"):
            llm_port = free_port()
            llm = Managed("scripted-llm", python_argv("-m", "fermix_dev.scripted_llm", "--port", str(llm_port)),
                          log_path=logs / "scripted-llm.log")
            procs.append(llm)
            wait_until(lambda: port_in_use(llm_port), 20, "scripted LLM", llm.proc)
            env.update(
                OPENAI_BASE_URL=f"http://127.0.0.1:{llm_port}/v1",
                OPENAI_API_KEY="scripted-model-no-key",
                FERMIX_PROVIDER="openai",
                FERMIX_MODEL="fermix-scripted",
            )
            _say(SCRIPTED_NOTICE)
        else:
            s = Settings()
            _say(f"provider: {s.resolved_provider()}, model: {s.resolved_model()}")
        gateway_url = f"http://{host}:{port}"
        env["FERMIX_GATEWAY_URL"] = gateway_url
        gw = Managed("gateway", python_argv("-m", "fermix_cli", "gateway", "--host", host, "--port", str(port)),
                     env=env, log_path=logs / "gateway.log")
        procs.append(gw)
        worker = Managed("worker", python_argv("-m", "fermix_cli", "worker", "--concurrency", str(concurrency),
                                               "--name", "dev@%h"), env=env, log_path=logs / "worker.log")
        procs.append(worker)
        # Beat fires scheduled jobs (fermix schedule add ...); RedBeat keeps its schedule in Redis.
        procs.append(Managed("beat", python_argv("-m", "fermix_cli", "beat"), env=env,
                             log_path=logs / "beat.log"))
        wait_until(lambda: httpx.get(f"{gateway_url}/healthz", timeout=1).status_code == 200,
                   30, "gateway", gw.proc)
        r = redis.Redis.from_url(env["FERMIX_REDIS_URL"], decode_responses=True)
        wait_until(lambda: r.hlen(keys.workers()) > 0, 60, "worker", worker.proc)
        _say(f"gateway at {gateway_url} (logs in {logs})")

        settings = Settings(redis_url=env["FERMIX_REDIS_URL"], gateway_url=gateway_url)
        buf = io.StringIO()
        code = run_agent(settings, "hello", "dev-smoke", timeout=60, out=buf)
        _say(f"smoke turn answered: {buf.getvalue().strip()!r}")
        if check_only:
            _say("--check: stack works; shutting down")
            return code
        _say("ready. In another terminal:")
        print(f"    FERMIX_GATEWAY_URL={gateway_url} .venv/bin/fermix agent -m 'what time is it?'")
        print(f"    curl -s -XPOST {gateway_url}/v1/agent -H 'content-type: application/json' "
              "-d '{\"message\":\"hi\"}'")
        print("  Ctrl-C stops everything.", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                for p in procs:
                    if p.proc.poll() is not None:
                        _say(f"{p.name} exited with code {p.proc.returncode}; stopping")
                        return 1
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        sys.stdout.flush()
