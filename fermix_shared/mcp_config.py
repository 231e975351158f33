"""MCP servers Fermix connects to: ``[[mcp_servers]]`` in fermix.toml (env
``FERMIX_MCP_SERVERS`` as a JSON list of the same tables).

A server is reached over stdio (``command``, ``args``, ``env``, ``cwd``: a child process the
worker starts) or streamable HTTP (``url``, ``headers``). Values of ``env`` and ``headers`` may
name environment variables of the worker as ``${NAME}``, expanded when the server is started,
so no secret has to sit in the TOML::

    [[mcp_servers]]
    name = "github"
    url = "https://api.githubcopilot.com/mcp/"
    headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }
    policy = "external_api"
    trust = "operator"

Its tools reach the model as ``<name>__<tool>`` with the server's ``policy`` class; ``trust``
says who may use them: ``operator`` (operators only) or ``guest`` (anyone the policy class
permits; guests see only ``read_only`` tools). Worker side: fermix_worker/mcp/.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from fermix_shared.models import PolicyClass, Trust

SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
# Separates the server's name from the tool's in the names the model sees.
TOOL_SEPARATOR = "__"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_REFERENCE_RE = re.compile(r"\$\{([^}]*)\}")


class McpServerConfig(BaseModel):
    """One MCP server: how to reach it, its policy class and who may use its tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # stdio: the program and its arguments; `env` is added to a minimal inherited environment
    # (HOME, PATH, ...: the worker's own secrets are not passed on).
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # Streamable HTTP: the endpoint and extra request headers.
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    policy: PolicyClass = "external_api"
    trust: Trust = "operator"
    # Seconds one call (and starting the server) may take before the model gets an error.
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SERVER_NAME_RE.match(v) or TOOL_SEPARATOR in v:
            raise ValueError(
                f"MCP server name {v!r}: use 1-32 letters, digits, '-' or '_', without '__' "
                "(it separates the server from the tool in tool names)"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_NAME_RE.match(key):
                raise ValueError(f"env: {key!r} is not an environment variable name")
            check_references(value, f"env {key}")
        return v

    @field_validator("headers")
    @classmethod
    def _header_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _HEADER_NAME_RE.match(key):
                raise ValueError(f"headers: {key!r} is not an HTTP header name")
            check_references(value, f"header {key}")
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        where = f"MCP server {self.name!r}"
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"{where}: give either `command` (stdio) or `url` (streamable HTTP), "
                f"{'not both' if self.command else 'one of them'}"
            )
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"{where}: url must start with http:// or https://")
            if self.args or self.env or self.cwd:
                raise ValueError(f"{where}: args, env and cwd are for stdio servers (`command`)")
        elif self.headers:
            raise ValueError(f"{where}: headers are for streamable HTTP servers (`url`)")
        if self.command is not None and not self.command.strip():
            raise ValueError(f"{where}: command is empty")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "streamable-http"


def check_references(template: str, where: str) -> None:
    """Refuse a malformed ``${...}`` reference (the variables themselves are read later, on
    the worker that starts the server)."""
    for ref in _REFERENCE_RE.findall(template):
        if not _ENV_NAME_RE.match(ref):
            raise ValueError(f"{where}: ${{{ref}}} does not name an environment variable")


def expand_env(template: str, environ: Mapping[str, str], where: str) -> str:
    """``template`` with each ``${NAME}`` replaced by ``environ[NAME]``; a variable that is not
    set is an error (a header or an env entry silently left empty would be worse)."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in environ:
            raise ValueError(f"{where} needs the environment variable {name}, which is not set")
        return environ[name]

    return _REFERENCE_RE.sub(value, template)


def _unique_names(servers: list[McpServerConfig]) -> list[McpServerConfig]:
    seen: set[str] = set()
    for s in servers:
        if s.name in seen:
            raise ValueError(f"MCP server {s.name!r} is declared twice")
        seen.add(s.name)
    return servers


# The type of ``Settings.mcp_servers``: names are unique.
McpServers = Annotated[list[McpServerConfig], AfterValidator(_unique_names)]
