"""``GET /v1/status``: queue activity, the workers seen, and the configured provider."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from fermix_gateway.auth import require_token
from fermix_shared.settings import Settings
from fermix_shared.stores.status import QueueStatus, queue_status

router = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])


def provider_json(settings: Settings) -> dict[str, Any]:
    """The primary provider and model as this gateway's settings resolve them (no fallbacks yet)."""
    return {
        "primary": settings.resolved_provider(),
        "model": settings.resolved_model(),
        "fallbacks": [],
    }


def status_json(status: QueueStatus, settings: Settings) -> dict[str, Any]:
    """The wire shape of ``GET /v1/status`` (camelCase, seconds as numbers)."""
    return {
        "activeConversations": status.active_conversations,
        "pendingConversations": status.pending_conversations,
        "activeRequests": status.active_requests,
        "pendingRequests": status.pending_requests,
        "workers": [{"name": w.name, "lastSeenAgo": w.last_seen_ago} for w in status.workers],
        "workersSeen": len(status.workers),
        "provider": provider_json(settings),
        "conversations": [
            {
                "conversation": c.conversation,
                "active": c.active,
                "leaseExpiresIn": c.lease_expires_in,
                "pending": c.pending,
            }
            for c in status.conversations
        ],
    }


@router.get("/status")
async def get_status(request: Request) -> dict[str, Any]:
    status = await queue_status(request.app.state.redis)
    return status_json(status, request.app.state.settings)
