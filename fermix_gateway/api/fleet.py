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

from fastapi import Request

from fermix_gateway.api.fleet_bodies import Fleet
from fermix_gateway.api.wire import v1_router
from fermix_shared.stores import fleet
from fermix_shared.stores.status import queue_status

router = v1_router()


async def fleet_json(request: Request) -> dict[str, Any]:
    """The snapshot, with the queue's counts."""
    r, settings = request.app.state.redis, request.app.state.settings
    snap = await fleet.snapshot_async(r, settings.redis_master)
    status = await queue_status(r)
    return {**snap, "queue": {"activeConversations": status.active_conversations,
                              "pendingConversations": status.pending_conversations,
                              "pendingRequests": status.pending_requests}}


@router.get("/fleet", response_model=Fleet)
async def get_fleet(request: Request) -> dict[str, Any]:
    return await fleet_json(request)
