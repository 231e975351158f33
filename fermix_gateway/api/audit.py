"""``GET /v1/audit/recent?agent=&run=&limit=``: the newest audit entries, newest first
(operators: the API token, like every ``/v1`` route).

``limit`` defaults to 100, at most 1000. ``agent`` (or ``agent_id``, as OpenFang spells it)
and ``run`` filter on the entry's agent and
run id; a filtered read looks at the newest 50,000 entries. The answer is ``{"entries": [...],
"head": {"seq", "hash"} | null, "anchor": {"seq", "hash"}}``; each entry is as stored (see
fermix_shared/audit/model.py): ``seq``, ``ts`` (ms), ``prev``, ``hash``, ``kind``, ``action``,
``outcome``, ``actor``, ``run``, ``conv``, ``agent``, ``detail``. ``fermix audit verify``
checks the chain.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from fermix_gateway.auth import require_token
from fermix_shared import audit, keys
from fermix_shared.audit.store import entry_json

router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

MAX_LIMIT = 1000


def _point(raw: dict[str, Any]) -> dict[str, Any] | None:
    return {"seq": int(raw["seq"]), "hash": raw.get("hash", "")} if raw.get("seq") else None


@router.get("/audit/recent")
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
