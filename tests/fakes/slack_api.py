"""A fake Slack Web API on 127.0.0.1 that the real ``slack_sdk.WebClient`` talks to.

Point the client (``FERMIX_SLACK_API_BASE``) at ``fake.url``: every call to
``{url}/{method}`` (form-encoded or JSON, as the SDK sends them) is recorded with its
arguments and time; ``chat.postMessage`` answers with an increasing ``ts`` and checks
``blocks`` as Slack does (``invalid_blocks``: section text over 3,000 characters, markdown
block text over 12,000 or markdown blocks over 12,000 characters together, a button without a
plain_text label of at most 75, an ``action_id`` over 255, a ``value`` over 2,000, a ``style``
other than primary/danger); ``blocks`` is recorded as the list it stands for, even
when sent form-encoded (a JSON string). Failures are scripted per method: ``fail_next``
answers an HTTP error (429 with ``Retry-After`` by default), ``error_next`` answers HTTP 200
``{"ok": false, "error": ...}`` the way Slack reports most errors. Methods it does not know
answer ``unknown_method``, as Slack does. ``chat.update`` and ``chat.delete`` act on the
messages it posted (``message_not_found`` otherwise; an update without ``blocks`` keeps the
message's blocks, as Slack does); :meth:`FakeSlack.channel` shows a channel as people see it
now, each message with every version it had and when (its markdown blocks' Markdown where it
has them, else its ``text``). ``reactions.add`` and
``reactions.remove`` keep each message's reactions (:meth:`FakeSlack.reactions`; the same one
twice is ``already_reacted``). A file goes through the external upload ``files_upload_v2``
makes: ``files.getUploadURLExternal`` hands out an upload URL on this server, the bytes are
posted there, and ``files.completeUploadExternal`` shares them as a message in the channel.

``sign`` makes the ``X-Slack-Signature`` headers Slack puts on webhooks.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs

KNOWN = frozenset({"chat.postMessage", "chat.postEphemeral", "chat.update", "chat.delete",
                   "auth.test", "assistant.threads.setStatus", "reactions.add",
                   "reactions.remove", "files.getUploadURLExternal",
                   "files.completeUploadExternal"})


@dataclass
class Message:
    """A posted message as the channel shows it now: ``text`` (with blocks, the notification
    fallback) and ``blocks``; ``versions`` is every version people saw (:attr:`shown`), with
    the time it got it (posted, then each update)."""

    channel: str
    ts: str
    thread_ts: str | None
    text: str
    versions: list[tuple[float, str]]
    deleted: bool = False
    # Files shared with the message (files.completeUploadExternal): (title, bytes) each.
    files: list[tuple[str, bytes]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def edits(self) -> int:
        return len(self.versions) - 1

    @property
    def markdown(self) -> str | None:
        """The Markdown of its markdown blocks (what Slack renders), None if it has none."""
        texts = [b["text"] for b in self.blocks if b.get("type") == "markdown"]
        return "\n".join(texts) if texts else None

    @property
    def shown(self) -> str:
        """What people read: the markdown blocks' Markdown, else the text."""
        return self.text if self.markdown is None else self.markdown


@dataclass(frozen=True)
class Call:
    """One request the fake received; ``ok`` is False when it answered with a failure."""

    method: str
    args: dict[str, Any]
    at: float
    ok: bool
    token: str | None = None


def blocks_error(blocks: Any) -> str | None:
    """Why Slack would answer ``invalid_blocks`` for ``blocks``, or None if they are fine (the
    checks our blocks can meet: markdown, sections, actions, buttons)."""
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= 50:
        return "blocks must be a list of 1-50 blocks"
    markdown = 0
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "markdown":
            text = block.get("text")
            if not (isinstance(text, str) and 1 <= len(text) <= 12000):
                return "markdown text must be 1-12000 characters"
            markdown += len(text)
            if markdown > 12000:
                return "markdown blocks must be at most 12000 characters together"
        elif kind == "section":
            text = block.get("text")
            if not (isinstance(text, dict) and text.get("type") in ("mrkdwn", "plain_text")
                    and isinstance(text.get("text"), str) and 1 <= len(text["text"]) <= 3000):
                return "section text must be 1-3000 characters"
        elif kind == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
                return "actions must hold 1-25 elements"
            for button in elements:
                if problem := _button_error(button):
                    return problem
        else:
            return f"unsupported block type {kind!r}"
    return None


def _button_error(button: Any) -> str | None:
    if not isinstance(button, dict) or button.get("type") != "button":
        return "actions element must be a button"
    label = button.get("text")
    if not (isinstance(label, dict) and label.get("type") == "plain_text"
            and isinstance(label.get("text"), str) and 1 <= len(label["text"]) <= 75):
        return "button text must be plain_text of 1-75 characters"
    if not (isinstance(button.get("action_id"), str) and len(button["action_id"]) <= 255):
        return "button action_id must be at most 255 characters"
    if "value" in button and not (isinstance(button["value"], str)
                                  and len(button["value"]) <= 2000):
        return "button value must be at most 2000 characters"
    if button.get("style") not in (None, "primary", "danger"):
        return "button style must be primary or danger"
    return None


@dataclass(frozen=True)
class _Failure:
    status: int
    error: str
    retry_after: float | None = None


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[Call] = field(default_factory=list)
    failures: dict[str, deque[_Failure | None]] = field(default_factory=lambda: defaultdict(deque))
    ts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    messages: dict[str, Message] = field(default_factory=dict)
    # (channel, ts) -> the reaction names on that message now; file id -> its uploaded bytes.
    reactions: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    uploads: dict[str, bytes | None] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    state: _State
    bot_user_id: str


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        method = self.path.split("?", 1)[0].strip("/").rsplit("/", 1)[-1]
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/upload/"):  # an upload URL files.getUploadURLExternal gave
            self._upload(method, data)
            return
        raw = data.decode()
        if "json" in (self.headers.get("Content-Type") or ""):
            args: dict[str, Any] = json.loads(raw) if raw else {}
        else:
            args = {k: v[0] for k, v in parse_qs(raw).items()}
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if isinstance(args.get("blocks"), str):  # form-encoded: a JSON string
            args["blocks"] = json.loads(args["blocks"])
        state = self.server.state
        with state.lock:
            queued = state.failures.get(method)
            failure = queued.popleft() if queued else None
            if failure is None and method not in KNOWN:
                failure = _Failure(200, "unknown_method")
            if failure is None and args.get("blocks") not in (None, []) and blocks_error(
                    args["blocks"]):
                failure = _Failure(200, "invalid_blocks")
            now = time.time()
            ts = next(state.ts)
            if failure is None:
                failure = _apply(state, method, args, f"{1_700_000_000 + ts}.{ts:06d}", now)
            state.calls.append(Call(method, args, now, failure is None, token))
        if failure is not None:
            headers = {"Retry-After": f"{failure.retry_after:g}"} if failure.retry_after else {}
            self._reply(failure.status, {"ok": False, "error": failure.error}, headers)
        elif method == "chat.postMessage":
            self._reply(200, {"ok": True, "channel": args.get("channel"),
                              "ts": f"{1_700_000_000 + ts}.{ts:06d}",
                              "message": {"text": args.get("text"), "user": self.server.bot_user_id,
                                          **({"blocks": args["blocks"]} if "blocks" in args
                                             else {})}})
        elif method in ("chat.update", "chat.delete"):
            self._reply(200, {"ok": True, "channel": args.get("channel"), "ts": args.get("ts"),
                              **({"text": args.get("text")} if method == "chat.update" else {})})
        elif method == "files.getUploadURLExternal":
            host, port = self.server.server_address[:2]
            file_id = f"F{ts:08d}"
            with state.lock:
                state.uploads[file_id] = None
            self._reply(200, {"ok": True, "file_id": file_id,
                              "upload_url": f"http://{host!s}:{port}/upload/v1/{file_id}"})
        elif method == "files.completeUploadExternal":
            self._reply(200, {"ok": True, "files": [
                {"id": f["id"], "title": f.get("title")} for f in json.loads(args["files"])]})
        elif method == "auth.test":
            self._reply(200, {"ok": True, "user_id": self.server.bot_user_id, "bot_id": "BFAKE",
                              "team_id": "TFAKE", "user": "fermix"})
        else:
            self._reply(200, {"ok": True})

    def _upload(self, file_id: str, data: bytes) -> None:
        state = self.server.state
        with state.lock:
            known = file_id in state.uploads
            if known:
                state.uploads[file_id] = data
        body = f"OK - {len(data)}".encode() if known else b"not found"
        self.send_response(200 if known else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


class FakeSlack:
    """The fake server; a context manager (``with FakeSlack() as slack: ...``)."""

    def __init__(self, bot_user_id: str = "UFERMIXBOT") -> None:
        self.bot_user_id = bot_user_id
        self._state = _State()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API base: ``FERMIX_SLACK_API_BASE`` (calls go to ``{url}/{method}``)."""
        assert self._server is not None, "FakeSlack is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/api"

    def start(self) -> FakeSlack:
        server = _Server(("127.0.0.1", 0), _Handler)  # bound (and listening) before we return
        server.state, server.bot_user_id = self._state, self.bot_user_id
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-slack",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def calls(self, method: str | None = None, *, ok: bool | None = None) -> list[Call]:
        """Calls received so far, in order; only ``method``'s, only (un)successful ones."""
        with self._state.lock:
            return [c for c in self._state.calls
                    if (method is None or c.method == method) and (ok is None or c.ok == ok)]

    def fail_next(self, method: str, status: int = 429, retry_after: float | None = 1) -> None:
        """The next call to ``method`` answers HTTP ``status`` (with ``Retry-After``)."""
        error = "ratelimited" if status == 429 else "fatal_error"
        with self._state.lock:
            self._state.failures[method].append(_Failure(status, error, retry_after))

    def error_next(self, method: str, error: str, *, after: int = 0) -> None:
        """The next call to ``method`` (after ``after`` more that succeed) answers HTTP 200
        ``{"ok": false, "error": error}``."""
        with self._state.lock:
            self._state.failures[method].extend([None] * after)
            self._state.failures[method].append(_Failure(200, error))

    def channel(self, channel: str) -> list[Message]:
        """The channel's messages now (deleted ones left out), in the order they were posted."""
        with self._state.lock:
            return [m for m in self._state.messages.values()
                    if m.channel == channel and not m.deleted]

    def reset(self) -> None:
        """Forget calls, messages and scripted failures."""
        with self._state.lock:
            self._state.calls.clear()
            self._state.failures.clear()
            self._state.messages.clear()
            self._state.reactions.clear()
            self._state.uploads.clear()

    def reactions(self, channel: str, ts: str) -> set[str]:
        """The reaction names on the message ``ts`` now."""
        with self._state.lock:
            return set(self._state.reactions.get((channel, ts), set()))


def _apply(state: _State, method: str, args: dict[str, Any], ts: str,
           now: float) -> _Failure | None:
    """Keep the channel's messages as a person sees them; Slack's error for a bad change."""
    text = str(args.get("text") or "")
    if method == "chat.postMessage":
        posted = Message(str(args.get("channel")), ts, args.get("thread_ts"), text, [],
                         blocks=list(args.get("blocks") or []))
        posted.versions.append((now, posted.shown))
        state.messages[ts] = posted
        return None
    if method in ("reactions.add", "reactions.remove"):
        on = state.reactions[(str(args.get("channel")), str(args.get("timestamp")))]
        name = str(args.get("name"))
        if method == "reactions.add" and name in on:
            return _Failure(200, "already_reacted")
        (on.add if method == "reactions.add" else on.discard)(name)
        return None
    if method == "files.getUploadURLExternal":
        return None if args.get("filename") and int(args.get("length") or 0) > 0 else _Failure(
            200, "invalid_arguments")
    if method == "files.completeUploadExternal":
        return _share(state, args, ts, now)
    if method not in ("chat.update", "chat.delete"):
        return None
    message = state.messages.get(str(args.get("ts")))
    if message is None or message.deleted or message.channel != args.get("channel"):
        return _Failure(200, "message_not_found")
    if method == "chat.delete":
        message.deleted = True
    else:
        message.text = text
        if "blocks" in args:  # without, Slack keeps the blocks; an empty list removes them
            message.blocks = list(args["blocks"] or [])
        message.versions.append((now, message.shown))
    return None


def _share(state: _State, args: dict[str, Any], ts: str, now: float) -> _Failure | None:
    """files.completeUploadExternal: the uploaded files as one message in the channel."""
    files = json.loads(str(args.get("files") or "[]"))
    if not files or any(state.uploads.get(f.get("id")) is None for f in files):
        return _Failure(200, "file_not_found")
    comment = str(args.get("initial_comment") or "")
    state.messages[ts] = Message(
        str(args.get("channel_id")), ts, args.get("thread_ts"), comment, [(now, comment)],
        files=[(str(f.get("title")), state.uploads[f["id"]] or b"") for f in files])
    return None


def sign(body: bytes, secret: str, timestamp: int | None = None) -> dict[str, str]:
    """Headers Slack would put on a webhook with ``body``: the v0 HMAC-SHA256 signature of
    ``v0:{timestamp}:{body}`` under the signing secret, and the timestamp (default now)."""
    ts = int(time.time()) if timestamp is None else timestamp
    base = f"v0:{ts}:".encode() + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(ts)}
