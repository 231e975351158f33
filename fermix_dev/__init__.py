"""Tooling for running Fermix on one machine and testing it; never imported by the gateway or
the worker.

- ``scripted_llm``: a fake model speaking the OpenAI and Anthropic wire formats (tests,
  benchmarks, and ``fermix dev`` without an API key).
- ``procs``: start and stop local processes (embedded Redis, gateway, workers).
- ``embedded``: the embedded defaults of one machine (the Redis under ``$FERMIX_HOME/dev/redis``,
  one server per directory, and the scripted model's settings), for ``dev`` and
  ``fermix agent --local``.
- ``dev``: ``fermix dev``, the whole stack with embedded defaults.
"""
