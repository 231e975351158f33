"""The file tools, confined to the turn's workspace (:mod:`fermix_worker.tools.workspace`).

``read_file``, ``list_files`` and ``search_files`` are ``read_only`` (guests get them);
``write_file`` and ``edit_file`` are ``read_write``. Every result is bounded: a read returns a
window of lines (``offset``/``limit``) under a character cap, a listing and a search stop at a
count and say so, a write or an edit never makes a file larger than ``WRITE_MAX_BYTES`` (an
edit's result size is computed from its count of matches before anything is replaced).

No call stalls the worker's other turns (under gevent, CPU work in a greenlet blocks them all):
a search's matching runs in a real OS thread of gevent's pool, with the regex engine releasing
the GIL (``concurrent=True``), and stops by itself after ``SEARCH_REGEX_SECONDS``. Recursive
walks never follow a symlinked directory and skip the usual bulk (``.git``, ``node_modules``,
...) unless the pattern names it.

Where things are:

* :mod:`~.definitions`: the tools as the model sees them, and :func:`file_tools`;
* :mod:`~.limits`: every cap;
* :mod:`~.read_write`: ``read_file``, ``write_file``, ``edit_file``;
* :mod:`~.listing`: ``list_files``, and the glob matching and walk a search shares;
* :mod:`~.search`: ``search_files``, its matching off the gevent hub;
* :mod:`~.common`: argument checks and the bounded whole-file read.
"""

from fermix_worker.tools.files.definitions import file_tools

__all__ = ["file_tools"]
