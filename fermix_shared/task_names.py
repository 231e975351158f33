"""Every Celery task's name, in one place: stable strings Flower shows and ``send_task`` uses,
and the queue they travel on.

The gateway sends tasks by these names and never imports the worker; the worker's task shells
(:mod:`fermix_worker.tasks`) register under them.
"""

from __future__ import annotations

# The broker queue every task goes to (the Celery app's default queue; its length is the
# backlog :mod:`fermix_shared.metrics` reports).
QUEUE = "fermix.turns"

# Run the conversation's next turn if no other worker holds it (args: [conv]).
DISPATCH_TASK = "fermix.conversation.dispatch"
# Send a gateway-made reply into a chat (args: [conv, text, delivery_id]).
SEND_TASK = "fermix.channel.send"
# Show one person of a chat a message only they see (args: [conv, user_id, text]).
PRIVATE_SEND_TASK = "fermix.channel.send_private"
# One subagent of a fan-out (a chord header task), and the chord's callback.
SUBAGENT_RUN_TASK = "fermix.subagents.run"
SUBAGENT_RESUME_TASK = "fermix.subagents.resume"
# An approval was answered: continue its parked turn (args: [approval_id]).
APPROVAL_RESUME_TASK = "fermix.approvals.resume"
# Beat's tick: fire every due scheduled job once, fleet-wide.
SCHEDULE_TICK_TASK = "fermix.schedule.tick"
# The memory review of one run now, and the coalesced review of a conversation's turns.
REVIEW_TASK = "fermix.memory.review"
REVIEW_CONVERSATION_TASK = "fermix.memory.review_conversation"
# POST a budget alert to ``[usage] alert_webhook``, signed, retried (args: [body]).
ALERT_WEBHOOK_TASK = "fermix.usage.alert_webhook"
# The flight recorder: replay a run from its record, fork it onto another model, agent or
# prompt (args: [job_id, run_id, options JSON]); the report goes to keys.recorder_job(job_id).
REPLAY_TASK = "fermix.recorder.replay"
FORK_TASK = "fermix.recorder.fork"
# One run of an eval case (args: [job_id, request JSON]); its result goes to
# keys.recorder_job(job_id) too.
EVAL_TASK = "fermix.eval.run"
