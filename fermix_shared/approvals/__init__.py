"""Approvals, the shared half: ``store`` (requests and their one decision, fleet-wide, in
Redis) and ``buttons`` (what an Approve / Deny button carries on each platform). The worker
parks and resumes turns (:mod:`fermix_worker.approvals`); the gateway takes the answers
(:mod:`fermix_gateway.approval_answers`, ``/v1/approvals``).
"""
