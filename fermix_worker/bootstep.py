"""The worker's bootstep: starts the process's :class:`~fermix_worker.runtime.Runtime` with the
worker and stops it with the worker, the way Celery's own components are started.

``make_celery`` adds it to every app's worker blueprint by name (the shared package never
imports the worker). It starts after the pool and before the consumer, so the collaborators
are built, the heartbeat beats and the reaper runs before the first task arrives. Two moments
of a graceful stop have no bootstep call of their own, and Celery signals them: SIGTERM
(``worker_shutting_down``: the grace starts at once, from the signal handler) and the pool's
end (``worker_shutdown``: the leases still held are released). The step connects the runtime
to both while it runs. It turns tracing on for the process when ``OTEL_*`` asks for it
(fermix_shared/tracing.py) and flushes the last spans at the pool's end.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from celery.signals import worker_shutdown, worker_shutting_down

from fermix_shared import tracing
from fermix_shared.redis.client import get_redis
from fermix_shared.settings import get_settings
from fermix_worker.runtime import Runtime


class RuntimeStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Builds, installs and starts the process's Runtime (module docstring)."""

    label = "fermix runtime"
    requires = ("celery.worker.components:Pool",)

    def create(self, w: Any) -> Runtime:
        runtime = Runtime.install(Runtime(get_settings(), get_redis(), w.app, node=w.hostname))
        # OTEL_* asks for traces (checked once per process; off, nothing is set up).
        tracing.setup("fermix-worker", runtime.name)

        def on_shutting_down(**_: Any) -> None:
            runtime.shutting_down()

        def on_shutdown(**_: Any) -> None:
            runtime.shutdown()
            tracing.flush()  # the last turns' spans, before the process exits

        # Held by the step: a weak receiver would be collected at once.
        self._receivers = (on_shutting_down, on_shutdown)
        worker_shutting_down.connect(on_shutting_down, weak=False)
        worker_shutdown.connect(on_shutdown, weak=False)
        return runtime
