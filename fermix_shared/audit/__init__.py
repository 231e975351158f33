"""The audit trail: one append-only, hash-chained log for the whole fleet.

What is recorded (kinds, fields): :mod:`fermix_shared.audit.model`. How entries chain:
:mod:`fermix_shared.audit.chain`. Appending, reading, retention and export in Redis:
:mod:`fermix_shared.audit.store`. Checking a chain (Redis or an exported file):
:mod:`fermix_shared.audit.verify`. Recording from emit points (fail open):
:mod:`fermix_shared.audit.emit`::

    from fermix_shared import audit

    audit.record(r, "admin", "schedule.create", "ok", actor="cli", job="daily")
    await audit.arecord(r, "trust", "inbound", "pass", actor="telegram:9", conv=conv)
    await audit.arecord_refusal(r, "trust", "inbound", actor="telegram:9", conv=conv)
    acting = audit.recorder(r, audit.who(msg), trust=msg.trust)  # handed to the turn's tools
    acting.record("tool", "calculator", "ok", ms=0.4, args_sha256=...)
"""

from __future__ import annotations

from fermix_shared.audit.chain import GENESIS, arguments_digest, canonical_json, text_digest
from fermix_shared.audit.emit import (
    Recorder,
    Who,
    arecord,
    make_body,
    record,
    recorder,
    who,
)
from fermix_shared.audit.model import AuditConfig, AuditEntry, Kind, Outcome
from fermix_shared.audit.refusals import arecord_refusal
from fermix_shared.audit.store import (
    Appended,
    AuditLog,
    BrokenAnchor,
    apply_retention,
    recent_async,
)
from fermix_shared.audit.verify import Break, ChainPoint, Verified, verify

__all__ = [
    "GENESIS", "Appended", "AuditConfig", "AuditEntry", "AuditLog", "Break", "BrokenAnchor",
    "ChainPoint", "Kind", "Outcome", "Recorder", "Verified", "Who", "arecord",
    "arecord_refusal", "apply_retention", "arguments_digest", "canonical_json", "make_body",
    "record", "recent_async", "recorder", "text_digest", "verify", "who",
]
