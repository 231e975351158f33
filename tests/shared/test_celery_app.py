"""The module-level Celery app reads its settings when Celery first needs its configuration,
not at import: a process that only imports it (the task shells, a tool listing tasks) never
fails on a bad ``FERMIX_*``, and a worker still gets the broker, the annotations and the
bootstep of its settings, as :func:`make_celery` gives them.

Each case runs in a fresh interpreter: the process-wide settings are read once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fermix_shared.celery_app import conf_for, make_celery
from fermix_shared.settings import Settings
from fermix_shared.task_names import SUBAGENT_RUN_TASK


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("FERMIX_", "CELERY_"))}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_importing_the_app_reads_no_settings() -> None:
    done = _python("import fermix_shared.celery_app as c; print(c.app.configured)",
                   FERMIX_LEASE_SECONDS="not-a-number")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    # The bad setting surfaces once the configuration is needed.
    done = _python("import fermix_shared.celery_app as c; c.app.conf.broker_url",
                   FERMIX_LEASE_SECONDS="not-a-number")
    assert done.returncode != 0 and "lease_seconds" in done.stderr


def test_the_app_is_configured_from_the_settings_on_first_use() -> None:
    env = {"FERMIX_REDIS_URL": "redis://127.0.0.1:6399/4",
           "FERMIX_SUBAGENT_TIMEOUT_SECONDS": "200", "FERMIX_TURN_TIMEOUT": "100"}
    done = _python(
        "import json; from fermix_shared.celery_app import app\n"
        "print(json.dumps({'broker_url': app.conf.broker_url,\n"
        "    'broker_transport': app.conf.broker_transport,\n"
        "    'task_default_queue': app.conf.task_default_queue,\n"
        "    'task_time_limit': app.conf.task_time_limit,\n"
        "    'task_annotations': app.conf.task_annotations,\n"
        "    'include': list(app.conf.include), 'steps': sorted(app.steps['worker'])}))",
        **env)
    assert done.returncode == 0, done.stderr
    settings = Settings(redis_url=env["FERMIX_REDIS_URL"], subagent_timeout_seconds=200,
                        turn_timeout=100)
    made = make_celery(settings)
    assert json.loads(done.stdout) == {
        "broker_url": "redis://127.0.0.1:6399/4",
        "broker_transport": conf_for(settings)["broker_transport"],
        "task_default_queue": "fermix.turns",
        "task_time_limit": 220,
        "task_annotations": {SUBAGENT_RUN_TASK: {"time_limit": 320}},
        "include": list(made.conf.include),
        "steps": sorted(made.steps["worker"]),
    }
    assert made.conf.task_annotations == {SUBAGENT_RUN_TASK: {"time_limit": 320}}
    assert sorted(made.steps["worker"]) == ["fermix_worker.bootstep:RuntimeStep"]
