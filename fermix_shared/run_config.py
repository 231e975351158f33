"""``[runs]`` in fermix.toml: what a run's event stream carries.

Tool details (a call's arguments, its progress text and its result) are on the ``tool`` stream
only in verbose mode, as Fased strips them otherwise: a run asks for it (``POST /v1/agent``
``"verbose": true``), else the operator's ``[runs] verbose`` (env ``FERMIX_RUNS__VERBOSE``)
decides. Without them a tool event still says which tool (``name``, ``callId``), its
``phase`` and, for a result, ``isError``. Thinking is per agent
(:attr:`~fermix_shared.agents.definitions.AgentDefinition.stream_thinking`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fermix_shared.models import InboundMessage


class RunsConfig(BaseModel):
    """``[runs]``: ``verbose`` is the default for runs that do not choose."""

    model_config = ConfigDict(extra="forbid")

    verbose: bool = False


def verbose_for(msg: InboundMessage, config: RunsConfig) -> bool:
    """Whether ``msg``'s run stream carries tool details: its own choice, else the operator's."""
    return config.verbose if msg.verbose is None else msg.verbose
