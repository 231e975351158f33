"""VersionedRecord: the base of every record that crosses a process boundary.

Inbox messages, run records, loop checkpoints, subagent jobs and reports, scheduled jobs and
remembered facts are written by one process and read by another, possibly of another release.
Each carries ``schema_version``: a record written without one (before the field existed) reads
as the current version; a record of another version is refused loudly, never half-read.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, model_validator


class VersionedRecord(BaseModel):
    """Subclasses set ``SCHEMA_VERSION`` and bump it when a stored record's meaning changes."""

    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = 1

    @model_validator(mode="before")
    @classmethod
    def _known_version(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        version = data.get("schema_version", cls.SCHEMA_VERSION)
        if version != cls.SCHEMA_VERSION:
            raise ValueError(
                f"{cls.__name__} schema_version {version} is not {cls.SCHEMA_VERSION}; refusing")
        return {**data, "schema_version": version}
