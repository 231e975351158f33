"""Logs for every role: text or JSON lines (``FERMIX_LOG_FORMAT``), the turn's context, and
no secrets.

* **Context.** ``with log_context(run_id=..., conversation=..., agent=..., worker=...)`` marks
  everything logged inside it, in this thread or greenlet only: the fields live in a
  :mod:`contextvars` variable, and every greenlet (greenlet >= 1.0, as gevent uses) and every
  asyncio task runs in its own context. Nested blocks add to the outer fields.
* **Format.** ``text``: ``[ts: LEVEL/process] logger: [run_id] message``. ``json``: one object
  per line with ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``msg``, ``exc`` (traceback, when
  any) and the context fields that are set.
* **Trace.** With tracing on (fermix_shared/tracing.py), a line logged inside a span carries its
  ``trace_id`` too (text: ``[run_id trace_id=...]``), the way from a log line to its trace.
* **Redaction.** :class:`RedactSecrets` masks every configured secret value (``SecretStr``
  settings such as FERMIX_API_TOKEN and the bot tokens, provider keys and anything named
  ``*_KEY``/``*_TOKEN``/``*_SECRET``/``*_PASSWORD`` in the environment), passwords in URLs and
  Telegram bot tokens in API paths, in the message, its arguments and exception text, before
  any formatter sees the record. Values shorter than :data:`MIN_SECRET_CHARS` are not masked.

Roles call :func:`configure` (gateway, CLI) or :func:`install` on the handlers Celery made
(worker and beat: fermix_shared/celery_app.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, SecretStr

from fermix_shared import tracing
from fermix_shared.settings import Settings

LogFormat = Literal["text", "json"]
CONTEXT_FIELDS = ("run_id", "conversation", "agent", "worker", "task", "trace_id")
MIN_SECRET_CHARS = 4
MASK = "<redacted>"
TEXT_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(fermix_run)s%(message)s"

_context: ContextVar[Mapping[str, str] | None] = ContextVar("fermix_log_context", default=None)
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|BASIC_AUTH)$", re.IGNORECASE)
# A URL's password (scheme://user:password@host) and a bot token in a Bot API path.
_PATTERNS = (
    (re.compile(r"(\w[\w+.-]*://[^\s:/@]*:)([^\s@/]+)(@)"), rf"\g<1>{MASK}\g<3>"),
    (re.compile(r"/bot[^/\s]+/"), f"/bot{MASK}/"),
)


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Mark every record logged inside the block with ``fields`` (None values are skipped)."""
    merged = {**(_context.get() or {}), **{k: str(v) for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: str | None) -> None:
    """Mark every record logged from here to the end of the current task with ``fields``. For
    a gateway request (each runs in a task of its own): once it knows the run, the request's
    later lines, uvicorn's access line included, carry it. Elsewhere use :func:`log_context`."""
    _context.set({**(_context.get() or {}),
                  **{k: str(v) for k, v in fields.items() if v is not None}})


def current_context() -> dict[str, str]:
    """The context fields in force here."""
    return dict(_context.get() or {})


def _fields(record: logging.LogRecord) -> dict[str, str]:
    """The record's context: ``extra=`` values win over the block's."""
    ctx = dict(_context.get() or {})
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            ctx[name] = str(value)
    if "trace_id" not in ctx and (trace_id := tracing.current_trace_id()) is not None:
        ctx["trace_id"] = trace_id
    return ctx


def _secret_settings(model: BaseModel) -> Iterator[str]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            yield value.get_secret_value()
        elif isinstance(value, BaseModel):
            yield from _secret_settings(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, BaseModel):
                    yield from _secret_settings(item)


def secret_values(settings: Settings | None = None,
                  environ: Mapping[str, str] | None = None) -> set[str]:
    """Every secret value to mask: settings' ``SecretStr`` fields, keys named by provider
    routes (``api_key_env``), secret-looking environment variables and URL passwords."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if _SECRET_NAME.search(k)}
    urls = list(env.values())
    if settings is not None:
        values.update(_secret_settings(settings))
        values.update(env.get(r.api_key_env, "") for r in settings.routes if r.api_key_env)
        urls.append(settings.redis_url)
    for url in urls:
        values.update(m.group(2) for m in _PATTERNS[0][0].finditer(url))
    return {v for v in values if len(v) >= MIN_SECRET_CHARS}


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message, arguments, exception and stack text."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        super().__init__()
        ordered = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._values = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def redact(self, text: str) -> str:
        """``text`` with every secret masked."""
        if self._values is not None:
            text = self._values.sub(MASK, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when it formats
            return True
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class TextFormatter(logging.Formatter):
    """Celery's layout plus the logger's name and ``[run_id]`` when a turn is running (with
    ``trace_id=`` inside a span)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        marks = [fields.get("run_id", "")]
        if "trace_id" in fields:
            marks.append(f"trace_id={fields['trace_id']}")
        shown = " ".join(m for m in marks if m)
        record.fermix_run = f"[{shown}] " if shown else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        out.update(_fields(record))
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def install(handlers: Iterable[logging.Handler], settings: Settings,
            environ: Mapping[str, str] | None = None) -> None:
    """Give each handler our formatter and the redaction filter (replacing an older one)."""
    redactor = RedactSecrets(secret_values(settings, environ))
    for handler in handlers:
        handler.setFormatter(formatter(settings.log_format))
        for old in [f for f in handler.filters if isinstance(f, RedactSecrets)]:
            handler.removeFilter(old)
        handler.addFilter(redactor)


def configure(level: str | int, settings: Settings) -> logging.Handler:
    """Log everything at ``level`` and above to stderr in the configured format (replacing a
    handler an earlier call made); returns the handler."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "fermix"]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("fermix")
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    install([handler], settings)
    return handler
