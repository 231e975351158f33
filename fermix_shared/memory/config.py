"""``[memory]`` in fermix.toml: which remembered facts join a turn's prompt."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The seed's number: "5, // Top 5 most relevant" (tests/seeds/openfang-agent-lifecycle.txt).
DEFAULT_RECALL_TOP = 5


class MemoryConfig(BaseModel):
    """``[memory]`` in fermix.toml (env ``FERMIX_MEMORY__EMBEDDING_MODEL``, ...).

    A turn's prompt holds the ``recall_top`` facts most relevant to the user's message: by
    cosine similarity of embeddings when ``embedding_model`` is set (OpenAI's embeddings API,
    or an OpenAI-compatible server's at ``embedding_base_url``), by BM25 full-text ranking
    otherwise or when the embeddings call fails (fermix_worker/memory/recall.py).
    """

    model_config = ConfigDict(extra="forbid")

    recall_top: int = Field(default=DEFAULT_RECALL_TOP, ge=1, le=50)
    # e.g. "text-embedding-3-small"; unset: full-text ranking (Anthropic has no embeddings API).
    embedding_model: str | None = None
    # Unset: OPENAI_BASE_URL / OPENAI_API_KEY, as the OpenAI SDK reads them.
    embedding_base_url: str | None = None
    embedding_api_key_env: str | None = None
    # One embeddings call may take this long before the turn ranks by full text instead.
    embedding_timeout_seconds: float = Field(default=10.0, gt=0, le=120.0)
