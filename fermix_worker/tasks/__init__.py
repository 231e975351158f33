"""The worker's Celery tasks, one module per feature, each a thin shell: decode the
arguments, ask the process's :class:`~fermix_worker.runtime.Runtime` for what runs them, return.

``turns`` (dispatch, channel sends), ``subagents`` (a fan-out's header task and chord callback),
``approvals`` (resume a parked turn), ``memory`` (reviews), ``schedule`` (beat's tick),
``recorder`` (replay and fork a recorded run). Their
names are in :mod:`fermix_shared.task_names`; ``make_celery`` includes these modules by name.
"""
