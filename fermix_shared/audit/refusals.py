"""Refusals of strangers, counted rather than each appended.

A stranger (neither owner nor allowed) costs nothing to send, so an entry per dropped message
would let anyone write the audit trail. Instead each refusal is counted per sender and
:data:`WINDOW_S` window (one Redis hash per window, :func:`fermix_shared.keys.audit_refusals`),
and an entry is appended only when a sender's count in the window reaches 1, 10, 100, ...
(``detail.count`` says which, ``detail.window`` when the window began, in ms). Past
:data:`MAX_SENDERS` senders in a window, further strangers are counted together as
``stranger:*`` under the same rule. So a window holds at most about ``MAX_SENDERS * (1 +
log10(messages))`` refusal entries, however the flood is spread.

Every refusal entry carries ``detail.refusal = true``: retention by count leaves them out
(``audit_trim.lua``), so they can never push real history out; they go by age
(``[audit] max_age_days``). Fails open, as every audit write (:mod:`.emit`).
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis

from fermix_shared import keys
from fermix_shared.audit.emit import Who, aappend
from fermix_shared.audit.model import Kind, Scalar
from fermix_shared.audit.store import Appended

log = logging.getLogger(__name__)

WINDOW_S = 3600
# Senders per window counted (and audited) each on their own; the rest share "stranger:*".
MAX_SENDERS = 50
OTHERS = "stranger:*"


def worth_an_entry(count: int) -> bool:
    """1, 10, 100, ...: the counts at which a sender's refusals in a window are appended."""
    return count > 0 and str(count).rstrip("0") == "1"


async def count_refusal(r: aioredis.Redis, sender: str, now: float | None = None
                        ) -> tuple[str, int, int]:
    """Count one refusal of ``sender``: (who it is counted as, ``sender`` or
    :data:`OTHERS`; the count in the window so far; the window's start, epoch seconds)."""
    window = int(now if now is not None else time.time()) // WINDOW_S * WINDOW_S
    key = keys.audit_refusals(window)
    async with r.pipeline(transaction=True) as pipe:
        pipe.hincrby(key, sender, 1)
        pipe.expire(key, keys.AUDIT_REFUSALS_TTL_SECONDS)
        count, _ = await pipe.execute()
    # "#senders" counts first sightings (and over-cap hits); past the cap the sender's own
    # field is dropped again, so the hash stays MAX_SENDERS + 2 fields.
    if int(count) == 1 and int(await r.hincrby(key, "#senders", 1)) > MAX_SENDERS:
        await r.hdel(key, sender)
        return OTHERS, int(await r.hincrby(key, "#others", 1)), window
    return sender, int(count), window


async def arecord_refusal(r: aioredis.Redis, kind: Kind, action: str, *, actor: str,
                          conv: str = "", now: float | None = None, **detail: Scalar
                          ) -> tuple[int, Appended | None]:
    """Count a stranger's refusal (``actor``, ``channel:id``) and append its entry when the
    count calls for one (see the module docstring): (the count, the entry or None). Never
    raises: a failure is logged and counts as the first of its window."""
    try:
        who, count, window = await count_refusal(r, actor, now)
    except Exception as e:  # fail open: the refusal stands, unaudited
        log.error("audit: could not count a refusal of %s: %s", actor, e)
        return 1, None
    if not worth_an_entry(count):
        return count, None
    entry = await aappend(
        r, kind, action, "fail",
        Who(actor=who, run_id="", conv=conv if who == actor else "", agent=""),
        {**detail, "refusal": True, "count": count, "window": window * 1000,
         "window_s": WINDOW_S})
    return count, entry
