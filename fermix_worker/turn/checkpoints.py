"""Checkpoints: the one owner of a turn's saved :class:`LoopState` (``run_state`` in Redis).

The loop's state is written after every step, so a turn whose worker died resumes from its last
step on another worker; the memory review and a scheduled job's record read it after the turn.
"""

from __future__ import annotations

import redis

from fermix_shared import keys, tracing
from fermix_worker.loop_state import LoopState


class Checkpoints:
    def __init__(self, r: redis.Redis):
        self._r = r

    def save(self, state: LoopState, via: redis.client.Pipeline | None = None) -> None:
        """Write ``state`` (``via``: queued on that pipeline, which the caller runs)."""
        if via is not None:
            via.set(keys.run_state(state.run_id), state.model_dump_json(), ex=keys.RUN_TTL_SECONDS)
            return
        with tracing.span("fermix.checkpoint"):
            self._r.set(keys.run_state(state.run_id), state.model_dump_json(),
                        ex=keys.RUN_TTL_SECONDS)

    def load(self, run_id: str) -> LoopState | None:
        """The run's last checkpoint, or None when it has none (or it expired)."""
        raw = self._r.get(keys.run_state(run_id))
        return None if raw is None else LoopState.model_validate_json(raw)

    def usage(self, run_id: str) -> tuple[int, int]:
        """The run's (input, output) tokens so far; (0, 0) without a checkpoint."""
        state = self.load(run_id)
        return (0, 0) if state is None else (state.usage.input_tokens, state.usage.output_tokens)
