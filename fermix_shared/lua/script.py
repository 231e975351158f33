"""LuaScript: one ``.lua`` file of this folder, with the names of its KEYS and ARGV.

A script is called with a client and one keyword per declared name; the names are turned
into the positional KEYS and ARGV the script reads, in the declared order, so a call site
never counts positions and a missing or unknown name fails before Redis is reached::

    FINISH(r, active=..., inbox=..., ..., turn_id=..., entries=[...])

It runs with EVALSHA through redis-py's ``register_script``: the body crosses the network only
when the server does not know it yet (first use, or after a restart, failover or ``SCRIPT
FLUSH``), when redis-py loads it and retries. An asyncio client gets an awaitable; a pipeline
queues the call with its body (EVAL), so the pipeline needs no round trip to check for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, overload

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

Arg: TypeAlias = str | int | float | bytes
"""One KEYS or ARGV value; a variadic name (declared ``*name``) takes a list or tuple of them."""

FOLDER = Path(__file__).parent


class LuaScript:
    """A script's file, its KEYS names and its ARGV names, each in the order the script
    reads them. The last KEYS name and the last ARGV name may be declared ``*name``: it then
    takes a list (``KEYS[n..]`` / ``ARGV[n..]`` in the script)."""

    def __init__(self, name: str, *, keys: tuple[str, ...], args: tuple[str, ...]) -> None:
        _check_names(name, keys, args)
        self.name = name
        self.keys = keys
        self.args = args
        self.path = FOLDER / f"{name}.lua"
        self.source = self.path.read_text()
        # register_script only hashes the body, and the hash of these bytes is the same for
        # every client and server, so one Script (and one AsyncScript), registered on first
        # use, serves every client: each call passes its own client, and a server that lacks
        # the script gets it loaded. (A cache per connection pool would hold every pool ever
        # used alive, through the client each Script keeps.)
        self._body = self.source.encode()
        self._sync: Script | None = None
        self._async: AsyncScript | None = None

    def __repr__(self) -> str:
        return f"LuaScript({self.name!r}, keys={self.keys!r}, args={self.args!r})"

    def bind(self, values: Mapping[str, Arg | Sequence[Arg]]
             ) -> tuple[list[str | bytes], list[Arg]]:
        """KEYS and ARGV in the declared order. TypeError on a missing or unknown name, a list
        given to a single name (or a single value to a ``*name``), or a key that is no string."""
        declared = {_bare(n) for n in (*self.keys, *self.args)}
        missing = [n for n in declared if n not in values]
        extra = [n for n in values if n not in declared]
        if missing or extra:
            parts = [f"missing {', '.join(sorted(missing))}" if missing else "",
                     f"unknown {', '.join(sorted(extra))}" if extra else ""]
            raise TypeError(f"Lua script {self.name!r}: {'; '.join(p for p in parts if p)}")
        keys: list[str | bytes] = []
        for key in self._positional(self.keys, values):
            if not isinstance(key, str | bytes):
                raise TypeError(f"Lua script {self.name!r}: a key is a string, not {key!r}")
            keys.append(key)
        return keys, self._positional(self.args, values)

    @overload
    def __call__(self, client: aioredis.Redis, /, **values: Arg | Sequence[Arg]) -> Awaitable[Any]:
        ...

    @overload
    def __call__(self, client: redis.Redis, /, **values: Arg | Sequence[Arg]) -> Any: ...

    def __call__(self, client: redis.Redis | aioredis.Redis, /,
                 **values: Arg | Sequence[Arg]) -> Any:
        """Run the script (EVALSHA) and return its reply as the client decodes it."""
        keys, args = self.bind(values)
        if isinstance(client, redis.client.Pipeline | aioredis.client.Pipeline):
            # In a pipeline the body goes along (EVAL): redis-py's scripts would add a SCRIPT
            # EXISTS round trip before every pipeline that holds one, and Redis finds a known
            # body by its hash all the same.
            return client.eval(self.source, len(keys), *keys, *args)
        if isinstance(client, aioredis.Redis):
            if self._async is None:
                self._async = client.register_script(self._body)
            return self._async(keys, args, client=client)
        if self._sync is None:
            self._sync = client.register_script(self._body)
        return self._sync(keys, args, client=client)

    def _positional(self, names: tuple[str, ...], values: Mapping[str, Arg | Sequence[Arg]]
                    ) -> list[Arg]:
        out: list[Arg] = []
        for name in names:
            value = values[_bare(name)]
            if name.startswith("*"):
                if not isinstance(value, list | tuple):
                    raise TypeError(f"Lua script {self.name!r}: {name[1:]} takes a list")
                out.extend(value)
            elif isinstance(value, str | int | float | bytes):
                out.append(value)
            else:
                raise TypeError(f"Lua script {self.name!r}: {name} takes one value, "
                                f"not {type(value).__name__}")
        return out


def _bare(name: str) -> str:
    return name.removeprefix("*")


def _check_names(script: str, keys: tuple[str, ...], args: tuple[str, ...]) -> None:
    """Names are identifiers, unique across KEYS and ARGV (they share one call's keywords),
    and only the last of each may be variadic."""
    for group in (keys, args):
        for i, name in enumerate(group):
            if name.startswith("*") and i != len(group) - 1:
                raise ValueError(f"Lua script {script!r}: only the last name may be {name}")
    bare = [_bare(n) for n in (*keys, *args)]
    bad = [n for n in bare if not n.isidentifier()]
    if bad:
        raise ValueError(f"Lua script {script!r}: names must be identifiers: {bad}")
    repeated = sorted({n for n in bare if bare.count(n) > 1})
    if repeated:
        raise ValueError(f"Lua script {script!r}: names used twice: {repeated}")
