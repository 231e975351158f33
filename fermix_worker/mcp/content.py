"""An MCP tool result as the text a tool result carries to the model.

Text blocks are kept as they are; binary blocks (images, audio, blobs) are named, not inlined
(a tool result is text, and base64 would only eat the context); a result with no content but
structured content is that JSON. The host process renders, so only text crosses the pipe.
"""

from __future__ import annotations

import base64
import binascii
import json

from mcp import types

# Characters of one rendered result sent back to the worker; the tool registry cuts further
# (MAX_RESULT_CHARS) before the model sees it. Bounds the pipe, not the model.
MAX_RENDERED_CHARS = 100_000


def render_result(result: types.CallToolResult) -> str:
    parts = [_block(b) for b in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if len(text) > MAX_RENDERED_CHARS:
        text = text[:MAX_RENDERED_CHARS] + "\n[truncated]"
    return text


def _block(block: types.ContentBlock) -> str:
    match block:
        case types.TextContent(text=text):
            return text
        case types.ImageContent(mime_type=mime, data=data):
            return f"[image: {mime}, {_decoded_size(data)} bytes, not shown]"
        case types.AudioContent(mime_type=mime, data=data):
            return f"[audio: {mime}, {_decoded_size(data)} bytes, not shown]"
        case types.ResourceLink(uri=uri, name=name, mime_type=mime):
            return f"[resource link: {name} <{uri}>{f' ({mime})' if mime else ''}]"
        case types.EmbeddedResource(resource=types.TextResourceContents(uri=uri, text=text)):
            return f"[resource <{uri}>]\n{text}"
        case types.EmbeddedResource(resource=types.BlobResourceContents(
                uri=uri, mime_type=mime, blob=blob)):
            return f"[resource <{uri}>: {mime or 'binary'}, {_decoded_size(blob)} bytes, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)
