"""``GET /v1/audit/recent?agent=&run=&limit=``: the newest audit entries, newest first
(operators: the API token, like every ``/v1`` route).

``limit`` defaults to 100, at most 1000. ``agent`` (or ``agent_id``, as OpenFang spells it)
and ``run`` filter on the entry's agent and
run id; a filtered read looks at the newest 50,000 entries. The answer is ``{"entries": [...],
"head": {"seq", "hash"} | null, "anchor": {"seq", "hash"}}``; each entry is as stored (see
fermix_shared/audit/model.py): ``seq``, ``ts`` (ms), ``prev``, ``hash``, ``kind``, ``action``,
``outcome``, ``actor``, ``run``, ``conv``, ``agent``, ``detail``. ``fermix audit verify``
checks the chain, as does ``GET /v1/audit/verify`` (any role): ``{"ok", "checked": N,
"problem": str | null, "summary"}``, the chain walked from its anchor to its head.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Query, Request

from fermix_gateway.api.fleet_bodies import AuditPage, AuditVerified
from fermix_gateway.api.wire import refusals, v1_router
from fermix_shared import audit, keys
from fermix_shared.audit.store import PAGE, entry_json
from fermix_shared.audit.verify import ChainPoint, Verified, verify

router = v1_router()

MAX_LIMIT = 1000


def _point(raw: dict[str, Any]) -> dict[str, Any] | None:
    return {"seq": int(raw["seq"]), "hash": raw.get("hash", "")} if raw.get("seq") else None


@router.get("/audit/recent", response_model=AuditPage, responses=refusals({
    400: "`agent` and `agent_id` name different agents."}))
async def recent(
    request: Request,
    agent: str | None = Query(default=None, max_length=200),
    run: str | None = Query(default=None, max_length=200),
    limit: int = Query(default=100, ge=1, le=MAX_LIMIT),
    # OpenFang's spelling (``/api/audit/recent?agent_id=``): the same filter.
    agent_id: str | None = Query(default=None, max_length=200),
) -> dict[str, Any]:
    r = request.app.state.redis
    if agent and agent_id and agent != agent_id:
        raise HTTPException(400, "agent and agent_id name different agents; give one")
    agent = agent or agent_id
    entries = await audit.recent_async(r, agent=agent or None, run=run or None, limit=limit)
    head = _point(await r.hgetall(keys.audit_head()))
    anchor = _point(await r.hgetall(keys.audit_anchor())) or {"seq": 0, "hash": audit.GENESIS}
    return {"entries": [entry_json(e) for e in entries], "head": head, "anchor": anchor}


async def _chain_point(r: Any, key: str) -> ChainPoint | None:
    return ChainPoint(p["seq"], p["hash"]) if (p := _point(await r.hgetall(key))) else None


async def _walk(r: Any, anchor: ChainPoint, head: ChainPoint) -> Verified:
    """:func:`verify` a page at a time from ``anchor`` to ``head`` (the pure walk resumed at
    each page's last entry, so the whole chain is never held at once)."""
    at, count, seq = anchor, 0, anchor.seq + 1
    while True:
        upto = min(head.seq, seq + PAGE - 1)
        raws = await r.hmget(keys.audit_entries(), [str(s) for s in range(seq, upto + 1)]) \
            if seq <= upto else []
        last = upto >= head.seq
        part = verify(at, raws, head if last else None)
        count += part.count
        end = part.last if part.count else at.seq
        if not part.ok or last:
            return Verified(anchor, count, anchor.seq + 1 if count else 0, end if count else 0,
                            part.last_hash, part.broken)
        at, seq = ChainPoint(end, part.last_hash), upto + 1


async def verify_chain(r: Any) -> Verified:
    """``AuditLog.verify`` over the gateway's asyncio client: the chain from its anchor to
    its head; a trim that moves the anchor meanwhile starts the walk again."""
    for _ in range(3):
        anchor = await _chain_point(r, keys.audit_anchor()) or ChainPoint.origin()
        head = await _chain_point(r, keys.audit_head()) or ChainPoint.origin()
        result = await _walk(r, anchor, head)
        if result.ok or (await _chain_point(r, keys.audit_anchor())
                         or ChainPoint.origin()) == anchor:
            return result
    return result


@router.get("/audit/verify", response_model=AuditVerified)
async def verify_audit(request: Request) -> dict[str, Any]:
    """Whether the audit chain holds (a read: any role)."""
    result = await verify_chain(request.app.state.redis)
    return {"ok": result.ok, "checked": result.count,
            "problem": result.broken.describe() if result.broken else None,
            "summary": result.describe()}
