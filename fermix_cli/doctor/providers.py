"""``fermix doctor``: the provider route chain (``chain_from_settings``).

Every route needs its API key: the variable its ``api_key_env`` names, else the SDK's own
(``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``). Only whether a key is present is ever said, never
its value. A missing key on the primary route is a ``fail`` (every turn fails); on a fallback a
``warn`` (failing over to it would fail). With ``--live``, one 1-token call per distinct route
through the official SDK, at the route's base URL (its ``base_url``, else the SDK's
``*_BASE_URL`` variable, else the SDK's default), as the workers would make it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fermix_cli.doctor.check import Check, Level, clip, scrub
from fermix_shared.provider_routes import ProviderRoute, chain_from_settings
from fermix_shared.settings import Settings

SDK_KEY_ENV: dict[str, str] = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
SDK_URL_ENV: dict[str, str] = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}
LIVE_TIMEOUT_S = 30.0


def key_env(route: ProviderRoute) -> str:
    """The environment variable holding the route's API key."""
    return route.api_key_env or SDK_KEY_ENV[route.provider]


def base_url(route: ProviderRoute, env: Mapping[str, str]) -> str | None:
    """The route's base URL as the SDK will use it; None means the SDK's default."""
    return route.base_url or env.get(SDK_URL_ENV[route.provider]) or None


def _role(i: int) -> str:
    return "primary" if i == 0 else f"fallback {i}"


def check_route_keys(routes: Sequence[ProviderRoute], env: Mapping[str, str]) -> list[Check]:
    """One line per route: its key present or not, and where its calls go."""
    checks = []
    for i, route in enumerate(routes):
        var = key_env(route)
        url = base_url(route, env) or "the SDK's default base URL"
        if env.get(var):
            checks.append(Check("provider", "ok",
                                f"{route.name} ({_role(i)}): key present in {var}; calls go "
                                f"to {url}."))
            continue
        consequence = ("every turn fails" if i == 0
                       else "failing over to this route would fail")
        checks.append(Check("provider", "fail" if i == 0 else "warn",
                            f"{route.name} ({_role(i)}): {var} is not set, so {consequence}.",
                            f"export {var}=... on every worker (a local OpenAI-compatible "
                            "server that needs no key accepts any value)"))
    return checks


def distinct_routes(routes: Sequence[ProviderRoute], env: Mapping[str, str]
                    ) -> list[tuple[int, ProviderRoute]]:
    """(position, route) of the first route per (provider, model, base URL, key variable)."""
    seen: set[tuple[str, str, str | None, str]] = set()
    out = []
    for i, route in enumerate(routes):
        ident = (route.provider, route.model, base_url(route, env), key_env(route))
        if ident not in seen:
            seen.add(ident)
            out.append((i, route))
    return out


def _call(route: ProviderRoute, key: str, url: str | None, connect_s: float) -> None:
    import anthropic
    import openai

    messages: list[Any] = [{"role": "user", "content": "ping"}]
    if route.provider == "anthropic":
        anthropic.Anthropic(api_key=key, base_url=url, max_retries=0,
                            timeout=anthropic.Timeout(LIVE_TIMEOUT_S, connect=connect_s)
                            ).messages.create(model=route.model, max_tokens=1, messages=messages)
    else:  # the OpenAI adapter speaks Chat Completions with max_completion_tokens
        openai.OpenAI(api_key=key, base_url=url, max_retries=0,
                      timeout=openai.Timeout(LIVE_TIMEOUT_S, connect=connect_s)
                      ).chat.completions.create(model=route.model, max_completion_tokens=1,
                                                messages=messages)


def live_check(i: int, route: ProviderRoute, env: Mapping[str, str], connect_s: float) -> Check:
    """One 1-token call on the route; a failure is ``fail`` on the primary, else ``warn``."""
    # The SDKs take seconds to import: only a --live run pays for them.
    import anthropic
    import openai

    var, url = key_env(route), base_url(route, env)
    key = env.get(var) or ""
    bad: Level = "fail" if i == 0 else "warn"
    at = url or "the SDK's default base URL"
    started = time.monotonic()
    try:
        _call(route, key, url, connect_s)
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        said = clip(scrub(e.message, [key]))
        if e.status_code in (401, 403):
            fix = f"check the key in {var} (it must belong to {at})"
        elif e.status_code == 404:
            fix = f"check the model id {route.model!r} and the base URL {at}"
        elif e.status_code == 429:
            fix = "check the account's rate limits and credit with the provider"
        else:
            fix = "retry later; if it persists, check the provider's status page"
        return Check("provider.live", bad,
                     f"{route.name}: a 1-token call at {at} failed with HTTP {e.status_code}: "
                     f"{said}", fix)
    except (openai.APIConnectionError, anthropic.APIConnectionError) as e:
        kind = "timed out" if isinstance(e, openai.APITimeoutError | anthropic.APITimeoutError) \
            else "could not connect"
        return Check("provider.live", bad, f"{route.name}: a 1-token call to {at} {kind}.",
                     f"check {SDK_URL_ENV[route.provider]} (or the route's base_url) and "
                     "that this host can reach it")
    except (openai.OpenAIError, anthropic.AnthropicError) as e:
        return Check("provider.live", bad,
                     f"{route.name}: the SDK refused the call: {clip(scrub(str(e), [key]))}",
                     f"check {var} and the route's settings")
    ms = (time.monotonic() - started) * 1000
    return Check("provider.live", "ok",
                 f"{route.name}: answered a 1-token call at {at} in {ms:.0f} ms.")


def provider_checks(settings: Settings, env: Mapping[str, str], live: bool,
                    step: Callable[[str], None] | None = None) -> list[Check]:
    """Keys for every route; with ``live``, a call per distinct route that has its key
    (``step`` is told of each call before it is made)."""
    routes = chain_from_settings(settings)
    checks = check_route_keys(routes, env)
    for i, route in distinct_routes(routes, env) if live else []:
        if env.get(key_env(route)):
            if step is not None:
                step(f"doctor: a 1-token call to {route.name}")
            checks.append(live_check(i, route, env, settings.provider_connect_timeout))
    return checks
