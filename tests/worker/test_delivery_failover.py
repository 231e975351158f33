"""A reply is sent once even across a failover (issue 25 item 5).

A TurnRunner in this process, its Redis through three real sentinels (one primary, one
replica), delivering to the fake Telegram API. ``FERMIX_REDIS_WAIT_REPLICAS`` is unset
(``auto``, one replica connected): the mark that the reply is being delivered must be on the
replica before the platform receives the send; and when the primary dies after the send but
before the replica has the rest (the chunk's sent mark, the commit), the turn recovered on the
promoted replica commits the reply without sending it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fermix_shared import keys
from fermix_shared.channels.telegram import TelegramChannel
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey, InboundMessage, RunStatus
from fermix_shared.redis.client import client_for_settings
from fermix_shared.redis.replicas import wait_rule
from fermix_shared.settings import Settings
from fermix_shared.stores import history, queue, runs
from fermix_shared.stores.lease import TurnLease
from fermix_worker.providers.base import ModelRequest, ModelTurn
from fermix_worker.tools import ToolRegistry
from fermix_worker.turn import Delivered, TurnRunner
from tests.fakes.telegram_api import FakeTelegram
from tests.fleet import uniq
from tests.sentinels import SentinelSet
from tests.shared.redis.test_sentinel import sentinel_settings
from tests.worker.turn.test_runner import Model

TOKEN = "123456:TEST-token"
REPLY = "the one reply"


@pytest.fixture
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram(TOKEN) as fake:
        yield fake


def _settings(sset: SentinelSet, tg: FakeTelegram) -> Settings:
    s = sentinel_settings(sset, provider="openai", model="m", telegram_bot_token=TOKEN,
                          telegram_api_base=tg.url)
    assert wait_rule(s).label == "auto"
    return s


class SendHook(TelegramChannel):
    """The real channel, with ``before`` run as a send starts."""

    def __init__(self, settings: Settings, r: redis.Redis, before: Any = None):
        super().__init__(settings, r, chat_interval=0, group_interval=0)
        self.before = before

    def send_text(self, key: ConversationKey, text: str, *, delivery_id: str) -> None:
        if self.before is not None:
            self.before()
        super().send_text(key, text, delivery_id=delivery_id)


def _runner(r: redis.Redis, settings: Settings, model: Model, channel: TelegramChannel
            ) -> TurnRunner:
    return TurnRunner(r, settings, ToolRegistry([]), router=lambda: model,  # type: ignore[arg-type, return-value]
                      channels=lambda name: channel if name == "telegram" else None)


def _claim(r: redis.Redis, lease_s: float) -> tuple[InboundMessage, TurnLease]:
    msg = InboundMessage(key=ConversationKey(channel="telegram", chat_id="4242"),
                         text=uniq("hello"), trust="operator")
    queue.accept(r, msg)
    claimed, lease = queue.claim(r, msg.key.as_str(), "w:1", lease_s)
    assert lease is not None
    return claimed.messages[0], lease


def test_the_delivery_mark_is_on_the_replica_before_the_platform_gets_the_send(
    sset: SentinelSet, tg: FakeTelegram
) -> None:
    settings = _settings(sset, tg)
    r = client_for_settings(settings)
    [replica] = sset.replica_ports()
    resumed: list[float] = []
    timers: list[threading.Timer] = []

    def answer_with_the_replica_stalled(request: ModelRequest) -> ModelTurn:
        # The replica stops for 300 ms just as the answer comes back (under the 500 ms WAIT).
        sset.pause(replica)

        def resume() -> None:
            resumed.append(time.time())
            sset.resume(replica)
        timers.append(threading.Timer(0.3, resume))
        timers[0].start()
        return ModelTurn(content=REPLY, tool_calls=[], input_tokens=10)

    channel = SendHook(settings, r)
    runner = _runner(r, settings, Model(answer_with_the_replica_stalled), channel)
    marks: list[str | None] = []
    try:
        msg, lease = _claim(r, 30)
        channel.before = lambda: marks.append(r.hget(keys.active(msg.key.as_str()), "delivering"))
        assert runner.run([msg], lease) == Delivered(waiting=0)
        [send] = tg.calls("sendMessage")
        timers[0].join(5)
        # Sent only once the replica could have acknowledged the mark.
        assert send.at >= resumed[0], f"sent {resumed[0] - send.at:.3f} s before the replica had the mark"
        # The mark names the primary it was written on (a recovery tells a failover by it).
        primary = sset.client()
        assert marks == [primary.info("replication")["master_replid"]]
        primary.close()
    finally:
        sset.resume(replica)
        r.close()


def test_a_reply_sent_just_before_the_primary_died_is_not_sent_again(
    sset: SentinelSet, tg: FakeTelegram
) -> None:
    settings = _settings(sset, tg)
    r = client_for_settings(settings)
    [replica] = sset.replica_ports()
    primary = sset.client()

    def cut_the_replica_off() -> None:
        # The send happens; the replica, stalled and cut off from then on, never gets what
        # follows it (the chunk's sent mark, the commit): the replication lag of a failover.
        sset.pause(replica)
        primary.execute_command("CLIENT", "KILL", "TYPE", "replica")  # (older redis-py: _type="slave" only)

    channel = SendHook(settings, r, before=cut_the_replica_off)
    try:
        msg, lease = _claim(r, 1)
        runner = _runner(r, settings, Model(lambda q: ModelTurn(content=REPLY, tool_calls=[])),
                         channel)
        assert runner.run([msg], lease) == Delivered(waiting=0)
        assert len(tg.calls("sendMessage")) == 1
        old = sset.kill_primary()
        primary.close()
        sset.resume(replica)
        sset.wait_promoted(old)

        # On the promoted replica the turn is still taken; once its lease lapses, the reaper's
        # dispatch recovers it (as a worker does: claim, then resume).
        channel.before = None
        deadline = time.monotonic() + 15
        while True:
            try:
                claim, again = queue.claim(r, msg.key.as_str(), "w:2", 30)
            except redis.RedisError:
                claim, again = None, None  # still reconnecting
            if claim is not None and claim.kind != "busy":
                break
            assert time.monotonic() < deadline, "the turn never became recoverable"
            time.sleep(0.1)
        assert claim.kind == "orphan" and again is not None, claim
        recovered = _runner(r, settings, Model(lambda q: ModelTurn(content="a second answer",
                                                                    tool_calls=[])), channel)
        assert recovered.resume(claim.messages[0], again, claim.attempt) == Delivered(waiting=0)

        assert [c.body["text"] for c in tg.calls("sendMessage")] == [REPLY]  # once
        record = runs.get(r, msg.run_id)
        assert record is not None and (record.status, record.reply) == (RunStatus.ok, REPLY)
        said = [m.content for m in history.load(r, msg.key.as_str(), 100)
                if isinstance(m, ChatMessage) and m.role == "assistant"]
        assert said == [REPLY]
    finally:
        sset.resume(replica)
        r.close()
