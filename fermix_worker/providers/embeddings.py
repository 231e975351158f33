"""The embeddings adapter, for memory recall: OpenAI's embeddings API (or an OpenAI-compatible
server's) through the official SDK's ``client.embeddings.create``. Anthropic has no
embeddings API: an Anthropic-only setup leaves ``[memory] embedding_model`` unset and recall
ranks by full text."""

from __future__ import annotations

from typing import Any, Protocol

import openai

from fermix_shared.errors import ProviderError
from fermix_shared.settings import Settings
from fermix_worker.providers.errors import is_transport_error, translate
from fermix_worker.providers.routes import ProviderRoute, client_for

# Characters of a message sent to be embedded: well within an embedding model's input
# (8191 tokens for OpenAI's); a longer message is recalled by its head.
MAX_EMBED_CHARS = 8_000


class Embedder(Protocol):
    """Turns texts into vectors, one per text in order; raises ProviderError."""

    model: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class OpenAIEmbeddings:
    """One ``embeddings.create`` call per :meth:`embed`, with its own timeout."""

    def __init__(self, client: openai.OpenAI, model: str, timeout: openai.Timeout):
        self._client, self.model, self._timeout = client, model, timeout

    def embed(self, texts: list[str]) -> list[list[float]]:
        try:
            # "float": every OpenAI-compatible server speaks it (not all speak base64).
            response = self._client.embeddings.create(
                model=self.model, input=[t[:MAX_EMBED_CHARS] for t in texts],
                encoding_format="float", timeout=self._timeout,
            )
        except Exception as e:
            if not (isinstance(e, openai.OpenAIError) or is_transport_error(e)):
                raise
            raise translate(e, "openai embeddings", openai) from e
        data: list[Any] = sorted(response.data, key=lambda d: d.index)
        if len(data) != len(texts):
            raise ProviderError(f"embeddings: {len(data)} vectors for {len(texts)} texts",
                                provider="openai embeddings")
        return [[float(x) for x in d.embedding] for d in data]


def embedder_from_settings(settings: Settings) -> OpenAIEmbeddings | None:
    """The embedder ``[memory]`` configures, over the shared OpenAI client for its base URL
    and key; None without an ``embedding_model``. Raises ConfigError (no key, no client)."""
    memory = settings.memory
    if not memory.embedding_model:
        return None
    route = ProviderRoute(f"openai/{memory.embedding_model}", "openai", memory.embedding_model,
                          memory.embedding_base_url, memory.embedding_api_key_env)
    timeout = openai.Timeout(memory.embedding_timeout_seconds,
                             connect=min(settings.provider_connect_timeout,
                                         memory.embedding_timeout_seconds))
    return OpenAIEmbeddings(client_for(route, settings), memory.embedding_model, timeout)
