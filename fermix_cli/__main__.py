"""``python -m fermix_cli ...`` is the ``fermix`` command."""

from fermix_cli.main import main

main()
