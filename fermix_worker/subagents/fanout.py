"""CeleryFanOut: the :class:`~fermix_worker.subagents.contract.FanOut` that runs a ``subagents`` call as
``chord(group(fermix.subagents.run x N), fermix.subagents.resume)``.

The parked turn's deadline covers every wave of the call (``ceil(tasks / concurrency)`` times
the per-worker timeout, plus queueing slack) and a margin for the callback. A call the caps
refuse (bad arguments, too many tasks) starts no subagent: the callback is sent at once with
the error, so the model reads it as the call's result.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from celery import Celery, chord, group
from pydantic import BaseModel

from fermix_shared.celery_app import SUBAGENT_RESUME_TASK, SUBAGENT_RUN_TASK
from fermix_shared.messages import ToolCall
from fermix_shared.models import RunProfile
from fermix_shared.settings import Settings
from fermix_worker.subagents.caps import CALLBACK_MARGIN_S, SubagentCaps, caps_for
from fermix_worker.subagents.contract import FanOutRequest
from fermix_worker.subagents.runner import SubagentJob
from fermix_worker.subagents.tool import ArgsError, parse_args, task_count

log = logging.getLogger(__name__)


class FanOutMeta(BaseModel):
    """What the chord callback needs besides the header results (or the refusal)."""

    fanout_id: str
    conv: str
    run_id: str
    call_id: str
    tasks: list[str] = []
    result_bytes: int = 0
    # Set when the call was refused before anything started: the call's error result.
    refused: str = ""


class CeleryFanOut:
    """Builds and launches the chord for a parked turn's ``subagents`` call."""

    def __init__(self, app: Celery, settings: Settings):
        self._app = app
        self._settings = settings

    def _caps(self, profile: RunProfile) -> SubagentCaps:
        return caps_for(profile, self._settings.subagent_timeout_seconds)

    def deadline(self, call: ToolCall, profile: RunProfile) -> float:
        """Seconds the parked turn may wait for the callback."""
        caps = self._caps(profile)
        tasks = min(task_count(call.arguments), caps.max_tasks)
        return caps.park_s(tasks) if tasks else CALLBACK_MARGIN_S

    def launch(self, request: FanOutRequest) -> None:
        caps = self._caps(request.profile)
        meta = FanOutMeta(fanout_id=uuid.uuid4().hex, conv=request.conv, run_id=request.run_id,
                          call_id=request.call.id)
        try:
            args = parse_args(request.call.arguments, caps, ultra=request.profile == "ultra")
        except ArgsError as e:
            meta.refused = str(e)
            self._app.send_task(SUBAGENT_RESUME_TASK, args=[[], meta.model_dump()])
            return
        meta.tasks, meta.result_bytes = args.tasks, caps.result_bytes
        budget = caps.budget_s(len(args.tasks))
        jobs = [
            SubagentJob(
                fanout_id=meta.fanout_id, index=i, task=task, conv=request.conv,
                parent_run=request.run_id, trust=request.trust, profile=request.profile,
                result_format=args.result_format, parent_model=request.model,
                provider=args.provider, model=args.model,
                reasoning_effort=args.reasoning_effort, concurrency=caps.concurrency,
                timeout_s=caps.timeout_s, deadline_at=time.time() + budget,
                slots_ttl_s=budget + CALLBACK_MARGIN_S,
            )
            for i, task in enumerate(args.tasks)
        ]
        header = group(self._signature(SUBAGENT_RUN_TASK, job.model_dump()) for job in jobs)
        callback = self._signature(SUBAGENT_RESUME_TASK, meta.model_dump())
        chord(header, callback, app=self._app).apply_async()
        log.info("fan-out %s for %s: %d subagents, %d at a time", meta.fanout_id,
                 request.run_id, len(jobs), caps.concurrency)

    def _signature(self, name: str, arg: dict[str, Any]) -> Any:
        return self._app.signature(name, args=[arg])
