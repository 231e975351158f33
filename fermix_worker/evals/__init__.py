"""Running eval cases on a worker (``fermix eval``; fermix_shared/evals/ reads the suites)."""
