r"""A suite file: cases, the agents and models to run them on, and what each must do.

TOML (``[[case]]`` tables) or YAML (a ``cases:`` list), by the file's suffix::

    [suite]
    name = "support"          # default: the file's stem
    agents = ["default"]      # default for every case (default: the agent "default")
    models = ["openai/gpt-4.1-mini", "anthropic/claude-haiku-4-5"]  # default: the agent's own
    grader = "openai/gpt-4.1" # the rubric's model (default: the model the case ran on)

    [[case]]
    name = "multiplies"
    messages = ["What is 6*7?"]               # one turn per message, in order
    history = [{role = "user", content = "Hi"}, {role = "assistant", content = "Hello!"}]
    reference = "42"                          # a known good reply, shown to the grader
    [case.expect]
    contains = ["42"]
    not_contains = ["sorry"]
    regex = ['\b42\b']
    json_schema = {type = "object"}           # the reply is JSON and fits the schema
    tool_called = [{name = "calculator", args = {expression = {regex = '6\s*\*\s*7'}}}]
    tool_not_called = ["run_command"]
    max_steps = 3                             # model calls, every turn of the case
    max_cost_usd = 0.01
    max_latency_s = 10
    rubric = "The reply states the product as a number."

Every key is checked when the file is read: an unknown key, a bad regex or schema, a case
without a message is a :class:`SuiteError` naming the file, the case and the key.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fermix_shared.errors import UserInputError

MAX_CASES = 1000
MATCHER_KEYS = ("equals", "contains", "regex")


class SuiteError(UserInputError, ValueError):
    """The suite file cannot be read or is not a suite (the sentence says where)."""


def _listed(value: Any) -> Any:
    """A lone value where a list is expected: a list of one."""
    return [value] if isinstance(value, str | dict) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Turn(_Strict):
    """A message of the history the case starts from."""

    role: Literal["user", "assistant"]
    content: str = Field(min_length=1)


class ToolExpectation(_Strict):
    """A tool the run must call: its name and, optionally, matchers for its arguments (each
    listed argument must match: a value is compared as is; ``{regex = "..."}``,
    ``{contains = "..."}`` or ``{equals = ...}`` match a value as they say)."""

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("args")
    @classmethod
    def _matchers(cls, args: dict[str, Any]) -> dict[str, Any]:
        for key, want in args.items():
            if _is_matcher(want) and "regex" in want:
                _compiled(want["regex"], f"{key}.regex")
        return args


class Expect(_Strict):
    """What a run of the case must do (each key optional; module docstring)."""

    contains: list[str] = Field(default_factory=list)
    not_contains: list[str] = Field(default_factory=list)
    regex: list[str] = Field(default_factory=list)
    json_schema: dict[str, Any] | None = None
    tool_called: list[ToolExpectation] = Field(default_factory=list)
    tool_not_called: list[str] = Field(default_factory=list)
    max_steps: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_latency_s: float | None = Field(default=None, gt=0)
    rubric: str | None = Field(default=None, min_length=1)

    @field_validator("contains", "not_contains", "regex", "tool_not_called", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return _listed(value)

    @field_validator("tool_called", mode="before")
    @classmethod
    def _tools(cls, value: Any) -> Any:
        return [{"name": v} if isinstance(v, str) else v for v in _listed(value)]

    @field_validator("regex")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _compiled(pattern, "")
        return value

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                jsonschema.validators.validator_for(value).check_schema(value)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a JSON schema: {e.message}") from None
        return value


class Case(_Strict):
    """One conversation to run, and what its runs must do."""

    name: str = Field(min_length=1, max_length=200)
    messages: list[str] = Field(min_length=1, max_length=50)
    history: list[Turn] = Field(default_factory=list)
    # None or empty: the suite's.
    agents: list[str] | None = None
    models: list[str] | None = None
    reference: str | None = None
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="before")
    @classmethod
    def _message(cls, data: Any) -> Any:
        if isinstance(data, dict) and "message" in data:
            data = dict(data)
            if "messages" in data:
                raise ValueError("give message or messages, not both")
            data["messages"] = _listed(data.pop("message"))
        return data

    @field_validator("messages", "agents", "models", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return _listed(value)

    @field_validator("messages")
    @classmethod
    def _texts(cls, value: list[str]) -> list[str]:
        if any(not m.strip() for m in value):
            raise ValueError("a message is empty")
        return value


class SuiteHead(_Strict):
    name: str | None = Field(default=None, min_length=1, max_length=100)
    agents: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    models: list[str] = Field(default_factory=list)
    grader: str | None = Field(default=None, min_length=1)

    @field_validator("agents", "models", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return _listed(value)


@dataclass(frozen=True)
class Target:
    """One run to make: a case on an agent and a model (None: the agent's own), the
    ``repeat``-th time (1 first)."""

    case: Case
    agent: str
    model: str | None
    repeat: int = 1

    @property
    def label(self) -> str:
        """The table's column: the agent, and the model when the suite names one."""
        return self.agent if self.model is None else f"{self.agent} @ {self.model}"


@dataclass(frozen=True)
class Suite:
    name: str
    cases: list[Case]
    agents: list[str]
    models: list[str]
    grader: str | None = None

    def targets(self, repeat: int = 1) -> list[Target]:
        """Every run the suite asks for: case × agent × model × repeat, cases in file order."""
        out = []
        for case in self.cases:
            for agent in case.agents or self.agents:
                models: list[str | None] = [*(case.models or self.models)] or [None]
                for model in models:
                    out += [Target(case, agent, model, i) for i in range(1, repeat + 1)]
        return out


def _is_matcher(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in MATCHER_KEYS


def _compiled(pattern: Any, where: str) -> re.Pattern[str]:
    at = f"{where}: " if where else ""
    if not isinstance(pattern, str):
        raise ValueError(f"{at}a regex is a string")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{at}{pattern!r} is not a regex ({e})") from None


def _where(loc: tuple[int | str, ...], raw_cases: list[Any]) -> str:
    """A validation error's place: ``case 'name'`` (or ``case N``) and the key path."""
    parts = list(loc)
    if parts and parts[0] == "cases" and len(parts) > 1 and isinstance(parts[1], int):
        i = parts[1]
        name = raw_cases[i].get("name") if isinstance(raw_cases[i], dict) else None
        head = f"case {name!r}" if isinstance(name, str) else f"case {i + 1}"
        rest = [str(p) for p in parts[2:] if p not in ("function-after", "function-before")]
        return head + (": " + ".".join(rest) if rest else "")
    return ".".join(str(p) for p in parts) or "the suite"


class _File(_Strict):
    suite: SuiteHead = Field(default_factory=SuiteHead)
    cases: list[Case] = Field(min_length=1, max_length=MAX_CASES)


def parse(raw: Any, source: str, default_name: str = "suite") -> Suite:
    """A suite from its parsed file (a mapping with ``suite`` and ``case``/``cases``)."""
    if not isinstance(raw, dict):
        raise SuiteError(f"{source}: a suite is a table of [suite] and [[case]]s, not "
                         f"{type(raw).__name__}")
    data = dict(raw)
    if "case" in data:
        if "cases" in data:
            raise SuiteError(f"{source}: give [[case]] or cases, not both")
        data["cases"] = data.pop("case")
    found = data.get("cases")
    raw_cases: list[Any] = found if isinstance(found, list) else []
    try:
        parsed = _File.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "missing" and tuple(first["loc"]) == ("cases",):
            msg = "the suite has no [[case]]"
            raise SuiteError(f"{source}: {msg}") from None
        raise SuiteError(f"{source}: {_where(tuple(first['loc']), raw_cases)}: {msg}") from None
    names = [c.name for c in parsed.cases]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise SuiteError(f"{source}: two cases are named {dupes[0]!r}")
    head = parsed.suite
    return Suite(name=head.name or default_name, cases=parsed.cases, agents=head.agents,
                 models=head.models, grader=head.grader)


def load(path: Path) -> Suite:
    """The suite in ``path`` (``.toml``, ``.yaml`` or ``.yml``); SuiteError with a sentence."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"cannot read the suite {path}: {e}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            raw: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text)
        elif suffix == ".json":
            raw = json.loads(text)
        else:
            raise SuiteError(f"{path}: a suite is a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as e:
        raise SuiteError(f"{path} is not valid {suffix.lstrip('.').upper()}: "
                         f"{str(e).splitlines()[0]}") from None
    return parse(raw, str(path), path.stem)
