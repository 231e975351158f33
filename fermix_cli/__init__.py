"""The ``fermix`` command line: server commands (``gateway``, ``worker``, ``beat``, ``dev``),
the gateway's HTTP client (``agent``, ``status``) and ``schedule``. Entry point:
``fermix_cli.main:main``; ``python -m fermix_cli`` runs the same."""
