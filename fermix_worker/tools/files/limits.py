"""The caps every file tool honours: how much one call may read, write, list or search.

A read returns a window of lines under a character cap; a listing and a search stop at a count
and say so; a write or an edit never makes a file larger than :data:`WRITE_MAX_BYTES`.
"""

from __future__ import annotations

READ_DEFAULT_LINES = 1000
READ_MAX_LINES = 5000
READ_MAX_CHARS = 16_000
LINE_MAX_CHARS = 2000
# Larger files are refused by read_file and edit_file, and skipped by search_files.
READ_MAX_FILE_BYTES = 64 * 1024 * 1024
EDIT_MAX_FILE_BYTES = 8 * 1024 * 1024
SEARCH_MAX_FILE_BYTES = 4 * 1024 * 1024
WRITE_MAX_BYTES = 8 * 1024 * 1024
LIST_DEFAULT, LIST_MAX = 200, 1000
SEARCH_DEFAULT, SEARCH_MAX = 100, 500
# Seconds one search may spend matching, over all its lines.
SEARCH_REGEX_SECONDS = 2.0
SEARCH_LINE_CHARS = 300
# A file with a NUL byte in its first block is binary: not read, not searched.
SNIFF_BYTES = 8192
