"""The broker transport: kombu's Redis transport with one client per channel.

Publishing and consuming still work end to end over a real Redis (the Celery app's own
connection), the channel hands out one client for every publish and ack, and a new one once
kombu has replaced the connection pool (as it does after a reconnect).
"""

from __future__ import annotations

import redis
from kombu import Connection, Exchange, Queue

from fermix_shared.celery_app import make_celery
from fermix_shared.redis.broker import TRANSPORT, Channel
from fermix_shared.settings import Settings


def test_the_celery_app_publishes_through_our_transport(scratch_redis_url: str,
                                                         r: redis.Redis) -> None:
    app = make_celery(Settings(redis_url=scratch_redis_url))
    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, Channel)
    app.send_task("fermix.test.ping", args=["hello"], queue="fermix.test")
    app.send_task("fermix.test.ping", args=["again"], queue="fermix.test")
    assert r.llen("fermix.test") == 2


def test_one_client_per_pool_and_messages_round_trip(scratch_redis_url: str) -> None:
    queue = Queue("fermix.test.rt", Exchange("fermix.test.rt"), routing_key="rt")
    with Connection(scratch_redis_url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        first = channel._create_client()
        producer = conn.Producer()
        for i in range(3):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key="rt",
                             declare=[queue], serializer="json")
        assert channel._create_client() is first
        got = []
        with conn.Consumer(queue, callbacks=[lambda body, msg: (got.append(body), msg.ack())]):
            while len(got) < 3:
                conn.drain_events(timeout=5)
        assert got == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert channel._create_client() is first  # acks reused it too
        channel._disconnect_pools()  # what kombu does on a lost connection
        renewed = channel._create_client()
        assert renewed is not first and renewed.ping()


def test_one_result_backend_per_process_not_per_thread(scratch_redis_url: str) -> None:
    """Under gevent every task greenlet is a thread to Celery: a backend per thread was a new
    RedisBackend, pool and connections for every task."""
    import threading

    app = make_celery(Settings(redis_url=scratch_redis_url))
    seen: set[int] = {id(app.backend)}  # the process's first task
    threads = [threading.Thread(target=lambda: seen.add(id(app.backend))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1
