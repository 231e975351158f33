"""Fermix as a fleet of separate hosts (issue 19 item 1): each part in its own network
namespace with its own address on a private bridge, so every message between parts crosses a
network that a test can cut.

Hosts: ``redis`` (redis-server and the scripted model), ``gw1``/``gw2`` (gateways), ``w1``-``w3``
(workers, 8 slots each), ``b1``/``b2`` (beats). The test process is a client on the bridge too.
One fleet serves the module; the scenarios run in order (the partition and the rolling restart
last). A worker silent for 2 s is dead here (heartbeat every 0.5 s), so the partition is short.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared import keys
from fermix_shared.scheduling.jobs import JobRun
from fermix_shared.scheduling.parse import make_schedule, new_job, parse_delivery
from fermix_shared.scheduling.store import JobStore
from tests.fleet import (
    RollingTraffic,
    answer,
    chat_history,
    events,
    first_event,
    max_overlap,
    start,
    terminal_events,
    uniq,
    wait,
)
from tests.hosts import TOKEN, HostFleet, Part, base_env, start_llm
from tests.netns import NetnsError, Network, unavailable
from tests.worker.fleet.test_reaper_fleet import calls_for

pytestmark = pytest.mark.fleet

SLOTS = 8
HEARTBEAT_S, DEAD_S = 0.5, 2.0
# A cut-off worker's turn answers from another host within this of the cut: the dead-worker
# threshold, a reaper scan, the resumed model call.
RESUME_BOUND_S = DEAD_S + 4.0
ROLES = {"gw1": "gateway", "gw2": "gateway", "w1": "worker", "w2": "worker", "w3": "worker",
         "b1": "beat", "b2": "beat"}


@pytest.fixture(scope="module")
def model(logs_dir: Path) -> Iterator[tuple[HostFleet, ScriptedLLMServer]]:
    """The fleet and its scripted model; everything is torn down, on failure too."""
    reason = unavailable()
    if reason is not None:
        print(f"test_hosts_fleet skipped: {reason}")
        pytest.skip(reason)
    net, llm = Network(), None
    try:
        try:
            net.create()
            redis_host = net.add_host("redis")
            for name in ROLES:
                net.add_host(name)
        except NetnsError as e:  # e.g. no veth or bridge support in this kernel
            print(f"test_hosts_fleet skipped: {e}")
            pytest.skip(f"cannot build the hosts' network: {e}")
        llm = start_llm(net, redis_host)
        fleet = HostFleet(net, logs_dir / f"hosts-{net.tag}",
                          base_env(llm, f"redis://{redis_host.addr}:6379/0",
                                   FERMIX_WORKER_HEARTBEAT_SECONDS=str(HEARTBEAT_S),
                                   FERMIX_WORKER_DEAD_SECONDS=str(DEAD_S),
                                   FERMIX_WORKER_SHUTDOWN_GRACE="1",
                                   FERMIX_CANCEL_POLL_SECONDS="0.2"),
                          redis_host)
        fleet.logs.mkdir(parents=True)
        fleet.start_redis()
        parts = [fleet.spawn(kind, net.hosts[name], SLOTS) for name, kind in ROLES.items()]
        for part in parts:
            fleet.wait_ready(part)
        yield fleet, llm
    finally:
        net.destroy()
        if llm is not None:
            llm.stop()


@pytest.fixture
def fleet(model: tuple[HostFleet, ScriptedLLMServer]) -> HostFleet:
    return model[0]


@pytest.fixture
def llm(model: tuple[HostFleet, ScriptedLLMServer]) -> ScriptedLLMServer:
    return model[1]


def test_turns_through_both_gateways_run_once_in_order_on_several_hosts(
    fleet: HostFleet, llm: ScriptedLLMServer
) -> None:
    chats = {uniq("chat"): [uniq(f"t{i}") for i in range(3)] for _ in range(6)}
    for texts in chats.values():
        for t in texts:
            llm.script.push(Reply(text=f"answer to {t}", delay=0.3, match=t))
    gws = [fleet.http(url) for url in fleet.gateway_urls()]
    assert len(gws) == 2
    run_ids = {c: [start(gws[(i + j) % 2], t, c) for i, t in enumerate(texts)]
               for j, (c, texts) in enumerate(chats.items())}
    hosts = set()
    for c, texts in chats.items():
        runs = [wait(gws[1], rid) for rid in run_ids[c]]
        assert [r["reply"] for r in runs] == [f"answer to {t}" for t in texts]
        for before, after in zip(runs, runs[1:], strict=False):
            assert after["startedAt"] >= before["endedAt"], "turns of one chat overlapped"
        assert chat_history(fleet.redis(), c) == [p for t in texts for p in (("user", t), ("assistant", f"answer to {t}"))]
        hosts |= {fleet.host_of(r["worker"]) for r in runs}
        assert all(len(terminal_events(fleet.redis(), rid)) == 1 for rid in run_ids[c])
    print(f"18 turns in 6 chats ran on hosts {sorted(hosts)}")
    assert len(hosts) >= 2
    for http in gws:
        http.close()


def test_a_queue_in_one_chat_runs_in_order_one_turn_at_a_time(
    fleet: HostFleet, llm: ScriptedLLMServer
) -> None:
    chat, first = uniq("chat"), uniq("first")
    queued = [uniq(f"q{i}") for i in range(4)]
    llm.script.push(Reply(text=f"answer to {first}", delay=1.0, match=first),
                    *[Reply(text=f"answer to {t}", delay=0.2, match=t) for t in queued])
    gws = [fleet.http(url) for url in fleet.gateway_urls()]
    first_id = start(gws[0], first, chat)
    first_event(gws[1], first_id, "lifecycle")  # the first turn runs
    run_ids = [first_id, *[start(gws[i % 2], t, chat) for i, t in enumerate(queued)]]
    runs = [wait(gws[0], rid) for rid in run_ids]
    texts = [first, *queued]
    assert [r["reply"] for r in runs] == [f"answer to {t}" for t in texts]
    assert max_overlap([(r["startedAt"], r["endedAt"]) for r in runs]) == 1
    assert chat_history(fleet.redis(), chat) == [p for t in texts for p in (("user", t), ("assistant", f"answer to {t}"))]
    print(f"a queue of 5 ran on hosts {[fleet.host_of(r['worker']) for r in runs]}")
    for http in gws:
        http.close()


def test_subagents_fan_out_across_hosts(fleet: HostFleet, llm: ScriptedLLMServer) -> None:
    user = uniq("fan")
    tasks = [uniq(f"slice{i}") for i in range(6)]
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=user),
        *[Reply(text=f"found {t}", delay=0.5, match=t) for t in tasks],
        Reply(text=f"synthesized for {user}", match=user),
    )
    with fleet.http(fleet.gateway_urls()[0]) as http:
        run = wait(http, start(http, user, uniq("chat")), timeout=30)
        (end,) = [d for e, d in events(http, run["runId"])
                  if e == "diagnostic" and d.get("kind") == "subagents" and d.get("phase") == "end"]
    assert run["status"] == "ok" and run["reply"] == f"synthesized for {user}"
    assert [t["status"] for t in end["tasks"]] == ["completed"] * len(tasks)
    hosts = sorted({fleet.host_of(t["worker"]) for t in end["tasks"]})
    print(f"6 subagents ran on hosts {hosts}; the parent on {fleet.host_of(run['worker'])}")
    assert len(hosts) >= 2


def job_runs(fleet: HostFleet, name: str) -> list[JobRun]:
    return list(reversed(JobStore(fleet.redis()).runs(name)))


def in_flight(fleet: HostFleet, name: str) -> list[str]:
    """The job's runs still queued or running (their conversations)."""
    r = fleet.redis()
    convs = [*r.zrange(keys.active_index(), 0, -1), *r.zrange(keys.queued_index(), 0, -1)]
    return [c for c in convs if str(c).startswith(f"schedule|{name}|")]


def test_a_job_fired_by_two_beats_on_two_hosts_runs_once_per_tick(
    fleet: HostFleet, llm: ScriptedLLMServer
) -> None:
    assert {b.host.name for b in fleet.of("beat")} == {"b1", "b2"}
    wait_until(lambda: fleet.lock_holder() is not None, 20, "a beat holding the lock")
    name, text = uniq("tick"), uniq("tick job")
    store = JobStore(fleet.redis())
    store.add(new_job(name=name, message=text, schedule=make_schedule(every_s=1),
                      delivery=parse_delivery(None, None), trust="operator", created_by="test"))
    wait_until(lambda: len(job_runs(fleet, name)) >= 4, 20, "four runs")
    store.pause(name)
    wait_until(lambda: not in_flight(fleet, name), 15, "the last run to end")
    ticks = [r.scheduled_for or 0 for r in job_runs(fleet, name)]
    assert sorted(ticks) == sorted(set(ticks)), f"a tick ran twice: {ticks}"
    # On the 1 s grid; a tick a worker took up more than a second late coalesces the one it
    # missed (by design), so a gap may be 2 s, never 0 or off the grid.
    gaps = [b - a for a, b in zip(sorted(ticks), sorted(ticks)[1:], strict=False)]
    assert all(g > 0 and g % 1000 == 0 for g in gaps), gaps
    assert calls_for(llm, text) == len(ticks)
    store.remove(name)
    holder = fleet.lock_holder()
    print(f"{len(ticks)} ticks, one run each; beat on {holder.host.name if holder else '?'} held the lock")


def fenced_in_log(log: Path, run_id: str) -> bool:
    return any(run_id in line and "lost its lease; fenced" in line
               for line in log.read_text().splitlines())


def test_a_cut_off_workers_turn_resumes_on_another_host_and_it_is_fenced_after(
    fleet: HostFleet, llm: ScriptedLLMServer
) -> None:
    task = uniq("task")
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})], match=task),
        Reply(text="never delivered", delay=60, match=task),  # the host is cut off in this call
        Reply(text=f"42, resumed: {task}", match=task),
    )
    chat = uniq("chat")
    with fleet.http(fleet.gateway_urls()[0]) as http:
        run_id = start(http, task, chat)
        first_event(http, run_id, "lifecycle")
        wait_until(lambda: calls_for(llm, task) >= 2, 30, "the slow model call")
        victim = fleet.worker_on(fleet.host_of(http.get(f"/v1/runs/{run_id}").json()["worker"]))
        cut_at = time.monotonic()
        fleet.net.cut(victim.host)
        try:
            done = wait(http, run_id, timeout=30)
            took = time.monotonic() - cut_at
        finally:
            fleet.net.mend(victim.host)
        mended_at = time.monotonic()
        assert done["status"] == "ok" and done["reply"] == f"42, resumed: {task}"
        assert fleet.host_of(done["worker"]) != victim.host.name
        # Back on the network, the cut-off worker learns its lease is gone and stops its call.
        assert victim.proc.log_path is not None
        wait_until(lambda: fenced_in_log(victim.proc.log_path, run_id), 30, "the fencing")  # type: ignore[arg-type]
        fenced = time.monotonic() - mended_at
        print(f"{victim.host.name} cut off: answered on {fleet.host_of(done['worker'])} "
              f"{took:.2f} s after the cut; fenced {fenced:.2f} s after the link came back")
        assert took < RESUME_BOUND_S, f"resumed {took:.1f} s after the cut"
        assert len(terminal_events(fleet.redis(), run_id)) == 1
        assert [m for m in chat_history(fleet.redis(), chat) if m[0] == "assistant"] == [
            ("assistant", f"42, resumed: {task}")]
        evs = events(http, run_id)
        assert [d["phase"] for e, d in evs if e == "tool" and d["name"] == "calculator"] == [
            "start", "result"]
        assert calls_for(llm, task) == 3
        # ... and serves turns again.
        served_at = time.monotonic()
        assert serves_again(fleet, http, llm, victim.node)
        print(f"{victim.host.name} ran a new turn {time.monotonic() - served_at:.2f} s after the fencing")


def serves_again(fleet: HostFleet, http: httpx.Client, llm: ScriptedLLMServer, node: str) -> bool:
    """Waves of slow turns, one per slot of the fleet, until one runs on ``node``."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        texts = [uniq("again") for _ in range(12)]
        for t in texts:
            llm.script.push(Reply(text=f"answer to {t}", delay=0.5, match=t))
        runs = [wait(http, rid) for rid in [start(http, t, uniq("chat")) for t in texts]]
        assert [r["reply"] for r in runs] == [f"answer to {t}" for t in texts]
        if any(r["worker"].startswith(f"{node}@") for r in runs):
            return True
    return False


CHATS, PER_CHAT = 10, 10
STEPS = 3  # one per worker restart


def resumed(r: redis.Redis, run_id: str) -> bool:
    """Whether the run started again on another worker (it was handed over)."""
    entries: list[tuple[str, dict[str, str]]] = r.xrange(keys.run_events(run_id))  # type: ignore[assignment]
    return any(f["stream"] == "lifecycle" and json.loads(f["data"]).get("resumed")
               for _, f in entries)


def restart_one_at_a_time(fleet: HostFleet, parts: list[Part],
                          before_each: Callable[[int], None] = lambda i: None) -> list[str]:
    """Restart ``parts`` in turn; what each took, for the report."""
    out = []
    for i, part in enumerate(parts):
        before_each(i)
        exit_s, ready_s = fleet.restart(part, SLOTS)
        out.append(f"{part.proc.name} exit {exit_s:.1f} s + ready {ready_s:.1f} s")
    return out


def test_a_rolling_restart_of_every_host_loses_doubles_and_reorders_nothing(
    fleet: HostFleet, llm: ScriptedLLMServer
) -> None:
    # Three lanes at once, each one part at a time: the workers (traffic steps with them),
    # the gateways, the beats. Never two parts of a role down together.
    workers, gateways, beats = fleet.of("worker"), fleet.of("gateway"), fleet.of("beat")
    assert len(workers) == STEPS
    traffic = RollingTraffic(fleet.gateway_urls(), uniq("roll"), chats=CHATS,
                             per_chat=PER_CHAT, steps=STEPS, pause_s=0.3,
                             headers={"Authorization": f"Bearer {TOKEN}"})
    for c in range(CHATS):
        for n in range(PER_CHAT):
            t = traffic.text(c, n)
            # The first turn of each step outlasts a worker's grace: handed over if it runs there.
            slow = n * STEPS // PER_CHAT != (n - 1) * STEPS // PER_CHAT
            llm.script.push(Reply(text=f"answer to {t}", delay=1.5 if slow else 0.1, match=t))
    t0 = time.monotonic()
    with ThreadPoolExecutor(CHATS + 2) as pool:
        sent = [pool.submit(traffic.send_chat, c) for c in range(CHATS)]
        traffic.step(0, CHATS // 2, 15)
        lanes = [pool.submit(restart_one_at_a_time, fleet, gateways),
                 pool.submit(restart_one_at_a_time, fleet, beats)]
        took = restart_one_at_a_time(fleet, workers, lambda i: traffic.step(i, CHATS // 2, 15) if i else None)
        took += [line for lane in lanes for line in lane.result()]
        run_ids = [rid for f in sent for rid in f.result()]
    restarted = time.monotonic() - t0
    with fleet.http(fleet.gateway_urls()[0]) as http:
        outcomes = [wait(http, rid, timeout=30)["status"] for rid in run_ids]
    print(f"rolling restart of {len(took)} parts under {len(run_ids)} messages: "
          f"{restarted:.1f} s; " + ", ".join(took))
    assert outcomes == ["ok"] * CHATS * PER_CHAT
    r = fleet.redis()
    assert all(len(terminal_events(r, rid)) == 1 for rid in run_ids)
    print(f"{sum(resumed(r, rid) for rid in run_ids)} turns were handed over and resumed "
          "on another host")
    for c in range(CHATS):
        texts = [traffic.text(c, n) for n in range(PER_CHAT)]
        got = [(role, answer(text)) for role, text in chat_history(fleet.redis(), traffic.chat(c))]
        assert got == [p for t in texts for p in (("user", t), ("assistant", t))]
    wait_until(lambda: fleet.lock_holder() is not None, 20, "a restarted beat holding the lock")
