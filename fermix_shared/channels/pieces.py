"""A reply's pieces, fixed by the first attempt to deliver it.

A reply too long for one message goes out in pieces, each marked sent once the platform took
it (:func:`fermix_shared.keys.delivered`, by piece number), so a retried delivery (a worker
died mid-way, a rate limit, a platform error) sends only what is still to go. A piece number
means something only against the same cut: a retry by a worker that cuts the text otherwise
(a deploy between the two attempts changed a limit or the splitter) would skip text or send
it twice. So the first attempt stores its cut (:func:`fermix_shared.keys.delivery_pieces`,
with the text's digest), a retry of the same text sends that cut, and the cut is dropped once
the last piece is out; the marks then say ``all``, and nothing is sent again whatever the cut.
A stored cut is not checked against today's limits: a deploy that lowers a limit because the
platform refuses the old size leaves the deliveries already begun to fail as they did.

One round trip before the first send (store the cut unless one is there, read it and the
marks), one after each piece (its mark), where there used to be two per piece.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import redis

from fermix_shared import keys

# The mark that the whole delivery went out.
ALL = "all"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pending(r: redis.Redis, delivery_id: str, text: str, pieces: list[str]
            ) -> tuple[int, list[tuple[int, str]]]:
    """The delivery's piece count and the pieces still to send, by number, in order: of the
    first attempt's cut when it was of this ``text``, else of ``pieces`` (this cut)."""
    if not pieces:  # nothing to say: nothing stored
        return 0, []
    cut_key, marks_key = keys.delivery_pieces(delivery_id), keys.delivered(delivery_id)
    pipe = r.pipeline(transaction=False)
    pipe.set(cut_key, json.dumps({"of": _digest(text), "pieces": pieces}), nx=True,
             ex=keys.DEDUPE_TTL_SECONDS)
    pipe.get(cut_key)
    pipe.hkeys(marks_key)
    _, stored, marked = pipe.execute()
    sent = {_text(m) for m in marked}
    if ALL in sent:  # done before: the cut just stored again is not needed
        r.delete(cut_key)
        return len(pieces), []
    if stored is not None:
        cut = json.loads(_text(stored))
        if cut.get("of") == _digest(text):
            pieces = list(cut["pieces"])
    return len(pieces), [(i, p) for i, p in enumerate(pieces) if str(i) not in sent]


def mark_sent(r: redis.Redis, delivery_id: str, number: int, count: int) -> None:
    """Piece ``number`` of ``count`` went out; after the last, the delivery is ``all`` sent and
    its stored cut is dropped (until then it lives as long as the marks)."""
    marks_key, cut_key = keys.delivered(delivery_id), keys.delivery_pieces(delivery_id)
    pipe = r.pipeline(transaction=False)
    pipe.hset(marks_key, str(number), "sent")
    if number == count - 1:
        pipe.hset(marks_key, ALL, "sent")
        pipe.delete(cut_key)
    else:
        pipe.expire(cut_key, keys.DEDUPE_TTL_SECONDS)
    pipe.expire(marks_key, keys.DEDUPE_TTL_SECONDS)
    pipe.execute()
