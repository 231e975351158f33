"""Many MCP calls at once from greenlets of a monkey-patched process, as in a gevent worker:
``python -m tests.fakes.mcp_gevent_load CALLS SECONDS SERVERS_JSON``. Each call is the test
server's ``slow`` tool (SECONDS each) or the everything server's ``echo``, alternately, through
the real ToolRegistry. Prints one JSON line: wall time, results, and the longest the hub went
without running a 10 ms ticker (a blocked hub would show here).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

from fermix_shared.mcp_config import McpServerConfig  # noqa: E402
from fermix_shared.messages import ToolCall  # noqa: E402
from fermix_worker.mcp.tools import McpTools, ToolsWithMcp  # noqa: E402
from fermix_worker.tools.context import RunContext  # noqa: E402
from fermix_worker.tools.policy import OPERATOR  # noqa: E402


def main() -> None:
    calls, seconds = int(sys.argv[1]), float(sys.argv[2])
    servers = TypeAdapter(list[McpServerConfig]).validate_json(sys.argv[3])
    mcp = McpTools(servers)
    registry = ToolsWithMcp([], mcp).scoped(OPERATOR)  # lists both servers (first use)
    gaps: list[float] = []
    running = True

    def ticker() -> None:
        last = time.monotonic()
        while running:
            gevent.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    def one(i: int) -> tuple[bool, str]:
        call = (ToolCall(id=f"c{i}", name="test__slow", arguments={"seconds": seconds})
                if i % 2 == 0 else
                ToolCall(id=f"c{i}", name="everything__echo", arguments={"message": f"m{i}"}))
        result = registry.execute(call, RunContext())
        return result.is_error, result.content

    tick = gevent.spawn(ticker)
    started = time.monotonic()
    greenlets = [gevent.spawn(one, i) for i in range(calls)]
    gevent.joinall(greenlets, timeout=120)
    wall = time.monotonic() - started
    running = False
    tick.join()
    results = [g.value for g in greenlets if g.successful()]
    print(json.dumps({
        "wall": wall,
        "done": len(results),
        "errors": [c for e, c in results if e],
        "slept": sum("slept" in c for _, c in results),
        "echoed": sum("Echo: m" in c for _, c in results),
        "max_gap": max(gaps),
        "host_pid": mcp.host.pid,
    }), flush=True)
    mcp.close()


if __name__ == "__main__":
    main()
