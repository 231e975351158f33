"""Evaluation: agents tested like code (``fermix eval``; docs/features/eval.md).

:mod:`~fermix_shared.evals.suite` reads a suite file (TOML or YAML) into cases;
:mod:`~fermix_shared.evals.expect` checks one run of a case against its expectations (all but
the model-graded rubric, which a worker grades); :mod:`~fermix_shared.evals.report` folds the
runs into the table, the JSON and the JUnit XML. The worker that runs a case is
fermix_worker/evals/.
"""
