"""The ``subagents`` and ``skill_run`` tools: bounded worker agents run as a Celery chord.

* ``caps``: the seed's numbers (regular and /ultra) and the fan-out's deadline;
* ``tool``: the schema the model sees and the parse of a call's arguments;
* ``fanout``: CeleryFanOut, which builds and launches ``chord(group(run...), resume)``;
* ``contract``: what a turn that fans out asks of the machinery (``FanOut``, the request);
* ``semaphore`` (+ ``fermix_shared/lua/fanout_semaphore.lua``): the per-call concurrency cap,
  fleet-wide, with leased slots;
* ``runner``: one subagent's bounded loop, from taking a slot to its report;
* ``watch``: what stops a running subagent (/stop on the parent, its deadline);
* ``registry``, ``routing``, ``prompts``: a subagent's tools, provider route and prompt;
* ``results``: reports, byte shares, UTF-8 cuts and the merged tool result;
* ``skill_tool``, ``skill_run``: ``skill_run``, one skill (or ``sub`` agent) run as a chord of
  one subagent: the tool, what a name resolves to for the caller, the job and its result.

The Celery tasks are thin shells in ``fermix_worker.tasks.subagents``. This ``__init__``
imports nothing, so ``turn.py`` can import the prompts without pulling in the rest.
"""
