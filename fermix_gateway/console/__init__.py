"""The web console at ``/console``: server-rendered pages over the same stores and ``/v1`` API
a script uses, for the people who run the fleet (``FERMIX_CONSOLE=off`` leaves it out).

``session`` signs in with a token (a console session in an HttpOnly, SameSite=Strict cookie;
every state-changing request carries the session's CSRF token), ``pages`` renders the views
(fleet, approvals, agents, a conversation with its running turn live). The pages' actions and
live updates are ``static/console.js`` calling ``/v1`` with the session: no inline script, no
asset from elsewhere (``Content-Security-Policy: default-src 'self'``); every text from a
conversation or a tool is escaped (Jinja2's autoescape; the script sets ``textContent``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

HERE = Path(__file__).parent


def install(app: FastAPI) -> None:
    """Add the console's pages and static files to the gateway."""
    from fermix_gateway.console import admin_pages, ops_pages, pages, session

    app.include_router(session.router)
    app.include_router(pages.router)
    app.include_router(ops_pages.router)
    app.include_router(admin_pages.router)
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
