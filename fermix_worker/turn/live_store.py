"""The Redis record of one run's live reply: which message is live, what it shows, what was
sent (``block``), and the mark the final delivery sets first (``final``).

Keyed by run (:func:`fermix_shared.keys.live_reply`), so a turn resumed on another worker
after a crash keeps editing the same message, and a worker still previewing stops once the
final delivery has taken the message over.
"""

from __future__ import annotations

import redis

from fermix_shared import keys


class LiveStore:
    """The Redis record of one run's live reply (a hash, with a TTL)."""

    def __init__(self, r: redis.Redis, run_id: str):
        self._r = r
        self._key = keys.live_reply(run_id)

    def load(self) -> dict[str, str]:
        return dict(self._r.hgetall(self._key))  # type: ignore[arg-type]

    def claim(self, mid: str, shown: str) -> str:
        """Record ``mid`` as the live message unless another worker's is there; the winner."""
        pipe = self._r.pipeline()
        pipe.hsetnx(self._key, "mid", mid)
        pipe.hget(self._key, "mid")
        pipe.expire(self._key, keys.LIVE_REPLY_TTL_SECONDS)
        _, winner, _ = pipe.execute()
        if winner == mid:
            self.save(shown=shown)
        return str(winner)

    def save(self, **fields: str) -> None:
        mapping: dict[str | bytes, str | bytes] = dict(fields.items())
        pipe = self._r.pipeline()
        pipe.hset(self._key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(self._key, keys.LIVE_REPLY_TTL_SECONDS)
        pipe.execute()

    def is_final(self) -> bool:
        return bool(self._r.hexists(self._key, "final"))

    def finalize(self) -> dict[str, str]:
        """The record, marked final (previews stop) if there is one: a run that streamed
        nothing leaves no key behind."""
        state: dict[str, str] = dict(self._r.hgetall(self._key))  # type: ignore[arg-type]
        if state:
            self._r.hset(self._key, "final", "1")
        return state

    def retire(self) -> None:
        """The live message stays as it is; the next text starts a new one."""
        self._r.hdel(self._key, "mid", "shown")
