"""``python -m fermix_dev.scripted_llm --port P`` runs the scripted LLM server standalone."""

from .server import main

raise SystemExit(main())
