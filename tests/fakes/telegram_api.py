"""A fake Telegram Bot API on 127.0.0.1 that records what we sent.

Serves ``POST /bot{token}/{method}`` with JSON bodies, like the real API: ``sendMessage``
(checks the HTML as Telegram does: supported tags, balanced, entities, 4096 visible
characters; checks an inline keyboard in ``reply_markup``: button texts, ``callback_data`` of
1-64 bytes; answers a Message with increasing ids, its ``reply_markup`` echoed),
``editMessageText`` (the same checks; "message is not modified" for the same text, "message
to edit not found" for an id it never sent or deleted), ``deleteMessage``, ``sendChatAction``,
``answerCallbackQuery``, ``getMe``, ``setWebhook``, ``getWebhookInfo`` (the URL set; a
delivery error set in ``webhook_error``), ``setMessageReaction`` (only Telegram's reaction
emoji, :data:`REACTIONS`; kept in ``reactions``) and ``sendDocument`` (multipart/form-data, as
uploads are; the file kept on its message). It keeps every message as the chat shows it
now (:meth:`FakeTelegram.chat`) with its edits and their times. Failures are scripted per method
with :meth:`FakeTelegram.fail_next` (429 with ``retry_after``, 400 "can't parse entities", 500,
...). :meth:`FakeTelegram.hold_next` keeps the next call of a method waiting, then drops it
unanswered: a send that never reached Telegram (its sender died meanwhile).
"""

from __future__ import annotations

import email.policy
import html
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

# The emoji a bot may react with (Bot API ReactionTypeEmoji).
REACTIONS = frozenset({
    "👍", "👎", "❤", "🔥", "🥰", "👏", "😁", "🤔", "🤯", "😱", "🤬", "😢", "🎉",
    "🤩", "🤮", "💩", "🙏", "👌", "🕊", "🤡", "🥱", "🥴", "😍", "🐳", "❤‍🔥",
    "🌚", "🌭", "💯", "🤣", "⚡", "🍌", "🏆", "💔", "🤨", "😐", "🍓", "🍾", "💋",
    "🖕", "😈", "😴", "😭", "🤓", "👻", "👨‍💻", "👀", "🎃", "🙈", "😇", "😨",
    "🤝", "✍", "🤗", "🫡", "🎅", "🎄", "☃", "💅", "🤪", "🗿", "🆒", "💘", "🙉",
    "🦄", "😘", "💊", "🙊", "😎", "👾", "🤷‍♂", "🤷", "🤷‍♀", "😡",
})
_ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span",
                 "tg-spoiler", "a", "tg-emoji", "code", "pre", "blockquote"}
_TAG = re.compile(r"<[^>]*>")
_BAD_AMP = re.compile(r"&(?!(?:lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);)")
_LT_NOT_TAG = re.compile(r"<(?!/?[a-zA-Z][\w-]*(?:\s[^<>]*)?>)")


@dataclass(frozen=True)
class Call:
    """One request we received: ``status`` is the HTTP status we answered."""

    method: str
    body: dict[str, Any]
    at: float
    status: int


@dataclass
class Message:
    """A message as the chat shows it now: ``text`` is what a person sees (entities applied),
    ``versions`` every text it had with the time it got it (sent, then each edit)."""

    message_id: int
    chat_id: int | str
    text: str
    parse_mode: str | None
    versions: list[tuple[float, str]]
    tags: list[str] = field(default_factory=list)
    deleted: bool = False
    # A sendDocument message: the file's name and bytes (``text`` is its caption).
    document: tuple[str, bytes] | None = None

    @property
    def edits(self) -> int:
        return len(self.versions) - 1


@dataclass
class _Failure:
    method: str
    status: int
    description: str
    retry_after: float | None
    times: int
    after: int


@dataclass
class Hold:
    """The next call of ``method``, kept waiting: ``arrived`` is set when it comes; after
    :meth:`release` it is dropped unanswered and unrecorded (Telegram never got it)."""

    method: str
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128
    daemon_threads = True


class _Nesting(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.error: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _ALLOWED_TAGS:
            self.error = self.error or f'Unsupported start tag "{tag}"'
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.error = self.error or f'Unmatched end tag "{tag}"'
        else:
            self.stack.pop()


def html_error(text: str) -> str | None:
    """What Telegram would say about ``text`` with ``parse_mode=HTML``, or None if it is fine."""
    if _BAD_AMP.search(text) or _LT_NOT_TAG.search(text):
        return "Unsupported entity or unescaped character"
    parser = _Nesting()
    parser.feed(text)
    parser.close()
    if parser.error:
        return parser.error
    if parser.stack:
        return f'Can\'t find end tag corresponding to start tag "{parser.stack[-1]}"'
    return None


def keyboard_error(markup: Any) -> str | None:
    """What Telegram would say about an ``InlineKeyboardMarkup``, or None if it is fine."""
    if isinstance(markup, str):  # the API takes it JSON-serialized, too
        try:
            markup = json.loads(markup)
        except ValueError:
            return "can't parse reply keyboard markup JSON object"
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        return "field \"inline_keyboard\" of the InlineKeyboardMarkup should be an Array of Arrays"
    for button in (b for row in rows for b in row):
        if not isinstance(button, dict) or not isinstance(button.get("text"), str):
            return "can't find field \"text\""
        data = button.get("callback_data")
        if data is not None and not (isinstance(data, str) and 1 <= len(data.encode()) <= 64):
            return "BUTTON_DATA_INVALID"
        if data is None and not button.get("url"):
            return "BUTTON_TYPE_INVALID"
    return None


def keyboard_of(body: dict[str, Any]) -> list[list[dict[str, Any]]] | None:
    """The inline keyboard a sendMessage body carried (``reply_markup``), rows of buttons."""
    markup = body.get("reply_markup")
    if isinstance(markup, str):
        markup = json.loads(markup)
    return None if markup is None else list(markup["inline_keyboard"])


def _tags(text: str, parse_mode: str | None) -> list[str]:
    """The formatting a message carries (its entities, roughly)."""
    return _TAG.findall(text) if parse_mode == "HTML" else []


def _multipart(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/form-data body as the Bot API reads it: fields (numbers as numbers, JSON
    values parsed) and files as (filename, bytes)."""
    parsed = BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    body: dict[str, Any] = {}
    for part in parsed.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(data, bytes):
            raise ValueError("a form part without a name")
        if part.get_filename() is not None:
            body[name] = (part.get_filename(), data)
            continue
        value = data.decode()
        body[name] = int(value) if value.lstrip("-").isdigit() else value
    return body


def visible_text(text: str, parse_mode: str | None) -> str:
    return html.unescape(_TAG.sub("", text)) if parse_mode == "HTML" else text


class FakeTelegram:
    """The fake server. ``url`` is the API base (``FERMIX_TELEGRAM_API_BASE``)."""

    def __init__(self, token: str = "123456:TEST-token", bot_username: str = "fermix_test_bot"):
        self.token = token
        self.bot_username = bot_username
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._failures: list[_Failure] = []
        self._holds: list[Hold] = []
        self._seen: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._messages: dict[int, Message] = {}
        # (chat id, message id) -> the bot's reactions on that message now (setMessageReaction).
        self.reactions: dict[tuple[str, int], list[str]] = {}
        self.webhook: dict[str, Any] | None = None
        # getWebhookInfo's last delivery error: (unix time, message, updates pending).
        self.webhook_error: tuple[int, str, int] | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (stdlib name)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                if (hold := fake._take_hold(self.path)) is not None:
                    hold.arrived.set()
                    hold.released.wait()
                    self.close_connection = True
                    return
                status, payload = fake._handle(self.path, raw,
                                               self.headers.get("content-type") or "")
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            for hold in self._holds:
                hold.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def gateway_env(self, secret: str, owner: int) -> dict[str, str]:
        """What a gateway and its workers need to talk to this fake: the bot's token, name and
        API base, the webhook ``secret``, and the Telegram user ``owner`` as an owner."""
        return {"FERMIX_TELEGRAM_BOT_TOKEN": self.token,
                "FERMIX_TELEGRAM_WEBHOOK_SECRET": secret,
                "FERMIX_TELEGRAM_API_BASE": self.url,
                "FERMIX_TELEGRAM_BOT_USERNAME": self.bot_username,
                "FERMIX_OWNER_IDS": f"telegram:{owner}"}

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def calls(self, method: str | None = None) -> list[Call]:
        """Every request received (failed ones included), in order."""
        with self._lock:
            return [c for c in self._calls if method is None or c.method == method]

    def sent(self) -> list[dict[str, Any]]:
        """Bodies of the sendMessage calls that succeeded, as sent: a message edited later (a
        streamed reply's live message) is here with its first text; :meth:`chat` is what the
        chat shows now."""
        return [c.body for c in self.calls("sendMessage") if c.status == 200]

    def chat(self, chat_id: int | str) -> list[Message]:
        """The messages in the chat now (deleted ones left out), in the order they were sent."""
        with self._lock:
            return [m for m in self._messages.values()
                    if str(m.chat_id) == str(chat_id) and not m.deleted]

    def fail_next(self, method: str, status: int, description: str,
                  retry_after: float | None = None, *, times: int = 1, after: int = 0) -> None:
        """The next ``times`` calls of ``method`` fail, once ``after`` more have succeeded."""
        with self._lock:
            self._failures.append(_Failure(method, status, description, retry_after, times,
                                           self._seen.get(method, 0) + after))

    def hold_next(self, method: str) -> Hold:
        """Keep the next call of ``method`` waiting until :meth:`Hold.release`, then drop it."""
        hold = Hold(method)
        with self._lock:
            self._holds.append(hold)
        return hold

    def _take_hold(self, path: str) -> Hold | None:
        with self._lock:
            for hold in self._holds:
                if path.endswith(f"/{hold.method}"):
                    self._holds.remove(hold)
                    return hold
        return None

    def reset(self) -> None:
        with self._lock:
            for hold in self._holds:
                hold.release()
            self._holds.clear()
            self._calls.clear()
            self._failures.clear()
            self._seen.clear()
            self._messages.clear()
            self.reactions.clear()
            self.webhook = None
            self.webhook_error = None

    def _handle(self, path: str, raw: bytes, content_type: str = "") -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/bot(?P<token>[^/]+)/(?P<method>\w+)", path)
        if m is None or m["token"] != self.token:
            return 401 if m else 404, {"ok": False, "error_code": 401 if m else 404,
                                       "description": "Unauthorized" if m else "Not Found"}
        method = m["method"]
        try:
            body = (_multipart(raw, content_type) if content_type.startswith("multipart/")
                    else json.loads(raw or b"{}"))
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return 400, {"ok": False, "error_code": 400, "description": "Bad Request: bad JSON"}
        with self._lock:
            status, payload = self._answer(method, body)
            self._calls.append(Call(method, body, time.time(), status))
        return status, payload

    def _answer(self, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        for f in self._failures:
            if f.method == method and f.times > 0 and self._seen.get(method, 0) >= f.after:
                f.times -= 1
                err: dict[str, Any] = {"ok": False, "error_code": f.status,
                                       "description": f.description}
                if f.retry_after is not None:
                    err["parameters"] = {"retry_after": f.retry_after}
                return f.status, err
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return 404, {"ok": False, "error_code": 404, "description": "Not Found"}
        status, result = handler(body)
        if status != 200:
            return status, {"ok": False, "error_code": status, "description": result}
        self._seen[method] = self._seen.get(method, 0) + 1
        return 200, {"ok": True, "result": result}

    def _bot(self) -> dict[str, Any]:
        return {"id": int(self.token.split(":")[0]), "is_bot": True, "first_name": "Fermix",
                "username": self.bot_username}

    def _m_getMe(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        return 200, {**self._bot(), "can_join_groups": True, "can_read_all_group_messages": False,
                     "supports_inline_queries": False}

    def _m_getWebhookInfo(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        info: dict[str, Any] = {"url": (self.webhook or {}).get("url", ""),
                                "has_custom_certificate": False, "pending_update_count": 0}
        if self.webhook_error is not None:
            date, message, pending = self.webhook_error
            info.update(last_error_date=date, last_error_message=message,
                        pending_update_count=pending)
        return 200, info

    def _m_setWebhook(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        if not body.get("url"):
            return 400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook"
        self.webhook = body
        return 200, True

    def _m_sendChatAction(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        if "chat_id" not in body or not body.get("action"):
            return 400, "Bad Request: chat_id and action are required"
        return 200, True

    def _m_answerCallbackQuery(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        text = body.get("text")
        if not body.get("callback_query_id"):
            return 400, ("Bad Request: query is too old and response timeout expired or query ID "
                         "is invalid")
        if text is not None and (not isinstance(text, str) or len(text) > 200):
            return 400, "Bad Request: MESSAGE_TOO_LONG"
        return 200, True

    def _text_error(self, body: dict[str, Any]) -> str | None:
        text, mode = body.get("text"), body.get("parse_mode")
        if "chat_id" not in body or not isinstance(text, str):
            return "Bad Request: chat_id and text are required"
        if "reply_markup" in body and (problem := keyboard_error(body["reply_markup"])):
            return f"Bad Request: {problem}"
        if mode == "HTML" and (problem := html_error(text)):
            return f"Bad Request: can't parse entities: {problem}"
        visible = visible_text(text, mode)
        if not visible.strip():
            return "Bad Request: message text is empty"
        if len(visible.encode("utf-16-le")) // 2 > 4096:
            return "Bad Request: message is too long"
        return None

    def _m_editMessageText(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        if problem := self._text_error(body):
            return 400, problem
        message = self._messages.get(body.get("message_id") or 0)
        if message is None or message.deleted or str(message.chat_id) != str(body["chat_id"]):
            return 400, "Bad Request: message to edit not found"
        text, mode = body["text"], body.get("parse_mode")
        if visible_text(text, mode) == message.text and _tags(text, mode) == message.tags:
            return 400, ("Bad Request: message is not modified: specified new message content "
                         "and reply markup of the specified message are exactly the same as a "
                         "current content and reply markup of the message")
        message.text, message.parse_mode = visible_text(text, mode), mode
        message.tags = _tags(text, mode)
        message.versions.append((time.time(), message.text))
        return 200, {"message_id": message.message_id, "chat": {"id": message.chat_id},
                     "date": int(time.time()), "edit_date": int(time.time()),
                     "text": message.text}

    def _m_deleteMessage(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        message = self._messages.get(body.get("message_id") or 0)
        if message is None or message.deleted or str(message.chat_id) != str(body.get("chat_id")):
            return 400, "Bad Request: message to delete not found"
        message.deleted = True
        return 200, True

    def _m_setMessageReaction(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        reaction, message_id = body.get("reaction") or [], body.get("message_id")
        if "chat_id" not in body or not isinstance(message_id, int):
            return 400, "Bad Request: chat_id and message_id are required"
        if any(r.get("type") != "emoji" or r.get("emoji") not in REACTIONS for r in reaction):
            return 400, "Bad Request: REACTION_INVALID"
        self.reactions[(str(body["chat_id"]), message_id)] = [r["emoji"] for r in reaction]
        return 200, True

    def _m_sendDocument(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        document, caption = body.get("document"), str(body.get("caption") or "")
        mode = body.get("parse_mode")
        if "chat_id" not in body or not isinstance(document, tuple):
            return 400, "Bad Request: chat_id and document (a file upload) are required"
        if mode == "HTML" and (problem := html_error(caption)):
            return 400, f"Bad Request: can't parse entities: {problem}"
        visible = visible_text(caption, mode)
        if len(visible) > 1024:
            return 400, "Bad Request: message caption is too long"
        message_id = next(self._ids)
        self._messages[message_id] = Message(message_id, body["chat_id"], visible, mode,
                                             [(time.time(), visible)], _tags(caption, mode),
                                             document=document)
        return 200, {"message_id": message_id, "chat": {"id": body["chat_id"]},
                     "date": int(time.time()), "caption": visible,
                     "document": {"file_name": document[0], "file_size": len(document[1])}}

    def _m_sendMessage(self, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: N802
        if problem := self._text_error(body):
            return 400, problem
        text, mode = body["text"], body.get("parse_mode")
        visible = visible_text(text, mode)
        chat_id = body["chat_id"]
        message: dict[str, Any] = {
            "message_id": next(self._ids), "from": self._bot(), "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if int(chat_id) > 0 else "supergroup"},
            "text": visible,
        }
        if body.get("message_thread_id") is not None:
            message["message_thread_id"] = body["message_thread_id"]
            message["is_topic_message"] = True
        if (keyboard := keyboard_of(body)) is not None:
            message["reply_markup"] = {"inline_keyboard": keyboard}
        self._messages[message["message_id"]] = Message(
            message["message_id"], chat_id, visible, mode, [(time.time(), visible)],
            _tags(text, mode))
        return 200, message
