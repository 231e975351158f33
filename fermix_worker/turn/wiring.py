"""What a turn runs on: :class:`TurnWiring`, passed in, and :class:`TurnParts`, built from it.

The worker's :class:`~fermix_worker.runtime.Runtime` builds one wiring per process (its Redis,
settings, tools, provider router, channels, hooks, fan-out, post-turn listeners and skills);
:class:`TurnParts` turns it into the collaborators that starting a turn
(:mod:`~fermix_worker.turn.start`) and resuming one (:mod:`~fermix_worker.turn.resume`) share:
checkpoints, delivery, compaction, the loop's driver, the closer and the approval parking.
Nothing here holds a turn's state: one set of parts serves every turn of the process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from fermix_shared.agents.definitions import AgentDefinition, as_agent, turn_agent
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import Channel, InboundMessage
from fermix_shared.redis.durability import DeliveryWait
from fermix_shared.redis.replicas import wait_rule
from fermix_shared.settings import Settings
from fermix_shared.skills import SkillRegistry
from fermix_worker.approvals.park import ApprovalParking
from fermix_worker.compaction.conversation import ConversationCompactor
from fermix_worker.compaction.step import CompactionStep
from fermix_worker.providers import Router
from fermix_worker.recorder.recording import Recorder
from fermix_worker.subagents.contract import FanOut, NoFanOut
from fermix_worker.tools.base import ToolRegistry
from fermix_worker.turn.checkpoints import Checkpoints
from fermix_worker.turn.close import TurnCloser
from fermix_worker.turn.delivery import ChannelLookup, Deliverer
from fermix_worker.turn.drive import TurnDriver
from fermix_worker.turn.listeners import TurnListeners
from fermix_worker.turn.live_reply import LiveReplies


def no_channels(name: Channel) -> None:
    """No chat channel at all (tests, HTTP-only turns): replies go to the run record only."""
    return None


@dataclass(frozen=True)
class TurnWiring:
    """Everything a turn needs from outside it, built once by the process that runs turns.

    ``router`` builds the provider router (it raises ConfigError until the provider is
    usable, and every turn reports that); ``channels`` finds a chat platform's sender;
    ``fanout`` starts a parked turn's subagents; ``listeners`` react to ended turns;
    ``skills`` lists the skills a prompt may offer (None: no skills section).
    """

    redis: redis.Redis
    settings: Settings
    tools: ToolRegistry
    router: Callable[[], Router]
    channels: ChannelLookup = no_channels
    hooks: HookRegistry = field(default_factory=HookRegistry)
    fanout: FanOut = field(default_factory=NoFanOut)
    listeners: TurnListeners = field(default_factory=TurnListeners)
    skills: SkillRegistry | None = None

    def as_agent(self, msg: InboundMessage) -> tuple[InboundMessage, AgentDefinition]:
        """The message as its agent runs it (trust and tools narrowed), and the agent."""
        agent = turn_agent(self.settings.agents, msg.agent)
        return as_agent(msg, agent), agent


class TurnParts:
    """The collaborators built from one wiring, shared by every way a worker holds a turn."""

    def __init__(self, wiring: TurnWiring):
        r, settings, hooks = wiring.redis, wiring.settings, wiring.hooks
        self.wiring = wiring
        self.checkpoints = Checkpoints(r)
        self.recorder = Recorder(r, settings)
        self.deliverer = Deliverer(
            wiring.channels, hooks, settings.history_limit,
            LiveReplies(r, settings, wiring.channels),
            DeliveryWait(r, wait_rule(settings), settings.redis_wait_timeout_ms))
        self.compaction = CompactionStep(
            r, settings, ConversationCompactor(r, settings, wiring.router), hooks,
            self.deliverer.notice)
        self.driver = TurnDriver(settings, wiring.tools, wiring.router, hooks, self.checkpoints,
                                 self.compaction, self.deliverer.working, self.recorder)
        self.closer = TurnCloser(r, settings, self.deliverer, wiring.listeners, self.checkpoints,
                                 self.recorder)
        self.approvals = ApprovalParking(wiring, self.checkpoints)
