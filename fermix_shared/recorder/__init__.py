"""The flight recorder: every turn's model requests and responses and tool results, kept with
its run (``[recorder]``: ``keep_days``, default 7; ``max_bytes`` a run; secrets masked), so a
turn can be replayed exactly (``fermix replay``: no model called, no tool run, nothing
delivered; it proves the turn reproduces or names the first step that diverges) and forked
onto another model, agent or prompt (``fermix fork``). The worker writes the record
(fermix_worker/recorder/); this room holds its shape, settings and store."""

from fermix_shared.recorder.config import RecorderConfig
from fermix_shared.recorder.entries import (
    CallError,
    Cut,
    End,
    Entry,
    ModelCall,
    Request,
    Response,
    Start,
    Steer,
    ToolRun,
)
from fermix_shared.recorder.store import (
    Recording,
    append,
    exists_async,
    read,
    read_async,
    size_async,
)

__all__ = [
    "CallError", "Cut", "End", "Entry", "ModelCall", "RecorderConfig", "Recording", "Request",
    "Response", "Start", "Steer", "ToolRun", "append", "exists_async", "read", "read_async",
    "size_async",
]
