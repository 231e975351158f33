"""``GET /v1/fleet`` (viewer role): the fleet now, for the console's Fleet view and scripts.

``{"workers": [{"process", "node", "heartbeatAgoMs", "stopped", "slots", "turnsInFlight"}],
"gateways": [{"name", "seenAgoMs", "startedAt"}], "beat": {"leader", "lockExpiresInMs"},
"redis": {"role", "replicas", "usedMemory", "version", "aof", "lastSaveAt", "uptimeSeconds",
"sentinel"}, "turnsPerMinute": [{"minute", "ok", "error", "stopped"}], "queue":
{"activeConversations", "pendingConversations", "pendingRequests"}}`` (see
fermix_shared/stores/fleet.py for where each comes from).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from fermix_gateway.auth import require_token
from fermix_shared.stores import fleet
from fermix_shared.stores.status import queue_status

router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])


async def fleet_json(request: Request) -> dict[str, Any]:
    """The snapshot, with the queue's counts."""
    r, settings = request.app.state.redis, request.app.state.settings
    snap = await fleet.snapshot_async(r, settings.redis_master)
    status = await queue_status(r)
    return {**snap, "queue": {"activeConversations": status.active_conversations,
                              "pendingConversations": status.pending_conversations,
                              "pendingRequests": status.pending_requests}}


@router.get("/fleet")
async def get_fleet(request: Request) -> dict[str, Any]:
    return await fleet_json(request)
