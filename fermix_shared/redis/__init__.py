"""Redis plumbing, shared by every process: ``client`` (the clients, their retries, which
commands may be repeated), ``sentinel`` (where the primary is), ``broker`` (kombu's transport
for Celery), ``replicas`` and ``durability`` (what must reach a replica before an answer or a
send). What is stored where is :mod:`fermix_shared.keys` and :mod:`fermix_shared.lua`.
"""
