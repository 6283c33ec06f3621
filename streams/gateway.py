"""The gateway (`mnemoflow serve`): the host SDK over HTTP (FastAPI, OpenAPI page at /docs)
and over MCP (streamable HTTP at /mcp), for hosts that will not run a Kafka client.

Access needs `Authorization: Bearer <token>`; a token file (`{token: tenant}`, JSON or TOML)
says which tenant each token is, and every id a tenant gives is namespaced per tenant before
it reaches Kafka (`mnemoflow.agents.tenancy`). Without tokens the gateway is one local
tenant and answers only requests addressed to a loopback host. The work is done by
`mnemoflow.streams.gateway_service.Gateway`, shared by both faces.
"""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mnemoflow.agents import tenancy as TN
from mnemoflow.streams.config import Settings
from mnemoflow.streams.gateway_service import (
    Appended,
    Claimed,
    ClaimRequest,
    DecisionOut,
    Event,
    Gateway,
    MemoryWritten,
    RememberRequest,
    RevokeRequest,
    SessionConflict,
    SessionUnknown,
    TooLarge,
    UserForgotten,
    WaitRequest,
)
from mnemoflow.streams.producer import BrokerUnavailable, TopicsMissing

# documents the scheme in /docs ("Authorize"); the check itself is `_refusal`
BEARER = HTTPBearer(auto_error=False, description="a token of the gateway's token file")


def load_tenants(path: Path) -> dict[str, str]:
    """`{token: tenant}` from a JSON or TOML file (TOML: `"<token>" = "<tenant>"`), checked."""
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise TN.TenancyError(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise TN.TenancyError(f"{path}: expected a non-empty table of token -> tenant")
    TN.token_table(raw)  # every entry checked now, not at the first request
    return {str(k): v for k, v in raw.items()}


class TenantGuard:
    """ASGI wrapper for the MCP endpoint: 401 without a known bearer token, and in local mode
    (no tokens) 403 unless the request is addressed to a loopback host (DNS rebinding)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            refusal = _refusal(self.gateway, headers.get("authorization"), headers.get("host"))
            if refusal is not None:
                await JSONResponse({"detail": refusal.detail}, refusal.status_code,
                                   refusal.headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _refusal(gateway: Gateway, authorization: str | None, host: str | None) -> HTTPException | None:
    if not gateway.tokens:
        if not TN.is_loopback(TN.host_of(host)):
            return HTTPException(403, "this gateway runs without tokens: loopback hosts only")
        return None
    if gateway.tenant(authorization) is None:
        return HTTPException(401, "a known bearer token is needed (Authorization: Bearer <token>)",
                             {"WWW-Authenticate": "Bearer"})
    return None


async def _tenant(request: Request,
                  _: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> str:
    """The caller's tenant (HTTPException 401/403 otherwise), for every /v1 route."""
    gateway: Gateway = request.app.state.gateway
    authorization = request.headers.get("authorization")
    refusal = _refusal(gateway, authorization, request.headers.get("host"))
    if refusal is not None:
        raise refusal
    return gateway.tenant(authorization) or TN.LOCAL


Tenant = Annotated[str, Depends(_tenant)]


def _errors(app: FastAPI) -> None:
    """The gateway's refusals as HTTP statuses, each with its one-line message."""
    statuses: tuple[tuple[type[Exception], int], ...] = (
        (TN.TenancyError, 422), (SessionUnknown, 404), (SessionConflict, 409), (TooLarge, 413),
        (TopicsMissing, 503), (BrokerUnavailable, 503))
    for exc_type, status in statuses:
        async def handler(_: Request, exc: Exception, status: int = status) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status)
        app.add_exception_handler(exc_type, handler)


def create_app(settings: Settings, bootstrap: str, tenants: Mapping[str, str], *,
               host: str = "127.0.0.1") -> FastAPI:
    """The gateway's ASGI app. `tenants`: `{token: tenant}` (empty: the tokenless local
    mode, for a loopback `host` only: `tenancy.bind_refusal`); `host`: the address it will
    listen on."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings

    from mnemoflow.streams.gateway_mcp import build_mcp

    gateway = Gateway(settings, bootstrap, tenants)
    mcp = build_mcp(gateway)
    # stateless: every MCP request stands alone and names its tenant with its own token. The
    # Host check is TenantGuard's, the same as the API's (loopback hosts only without tokens;
    # with tokens the token is the guard), not the SDK's, which refuses a proxied Host.
    mcp.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            await gateway.stop()

    app = FastAPI(title="mnemoflow gateway", lifespan=lifespan,
                  description="The mnemoflow host SDK over HTTP (and MCP at /mcp). Ids are "
                  "namespaced per tenant (the bearer token's).")
    app.state.gateway = gateway
    _errors(app)

    @app.post("/v1/sessions/{session_id}/events", response_model=Appended, tags=["sessions"])
    async def append_event(session_id: str, event: Event, who: Tenant) -> Appended:
        """Append one session event: user_message, assistant_message, tool_result,
        agent_step, lifecycle (with its capability manifest) or feedback."""
        return await gateway.append(who, session_id, event)

    @app.post("/v1/sessions/{session_id}/claim", response_model=Claimed, tags=["sessions"])
    async def claim(session_id: str, who: Tenant, body: ClaimRequest | None = None) -> Claimed:
        """A step boundary: the packets ready for the next model request, rendered as user-role
        messages, reported delivered. `wait`: first wait for the pipeline's decision."""
        body = body or ClaimRequest()
        return await gateway.claim(who, session_id, body.wait, body.eventSeq)

    @app.post("/v1/sessions/{session_id}/wait", response_model=DecisionOut, tags=["sessions"])
    async def wait(session_id: str, who: Tenant, body: WaitRequest | None = None) -> DecisionOut:
        """Wait, up to `timeout`, for the pipeline's decision about the session's events:
        suppress, packet (then claim it), none, or timeout."""
        body = body or WaitRequest()
        return await gateway.wait(who, session_id, body.timeout, body.eventSeq)

    @app.post("/v1/memories", response_model=MemoryWritten, tags=["memories"])
    async def remember(body: RememberRequest, who: Tenant) -> MemoryWritten:
        """Write a fact (subject/predicate/object) or a free note to long-term memory."""
        return await gateway.remember(who, body)

    @app.post("/v1/memories/revoke", response_model=MemoryWritten, tags=["memories"])
    async def revoke(body: RevokeRequest, who: Tenant) -> MemoryWritten:
        """Hide a memory everywhere; facts and aliases extracted only from it go too."""
        return await gateway.revoke(who, body)

    @app.delete("/v1/users/{user_id}", response_model=UserForgotten, tags=["memories"])
    async def forget_user(user_id: str, who: Tenant, reason: str) -> UserForgotten:
        """Forget a user for good: every projection drops the user's memories, and the keys
        that sealed their text are shredded, so no replay brings it back. `reason` is kept,
        in the clear, in the event. There is no undo."""
        if not reason.strip():
            raise HTTPException(422, "a forget needs a reason")
        return await gateway.forget(who, user_id, reason)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        """Whether the broker answers and the gateway's topics exist (no token needed)."""
        ok, detail = await gateway.health()
        return JSONResponse({"ok": ok, **detail}, 200 if ok else 503)

    app.router.routes.append(Route("/mcp", TenantGuard(StreamableHTTPASGIApp(mcp.session_manager),
                                                       gateway)))
    return app
