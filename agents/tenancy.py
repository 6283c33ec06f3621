"""Tenancy rules of the gateway (`mnemoflow serve`): which tenant a bearer token names, and
how one tenant's ids are kept apart from every other tenant's on the shared topics.

Every id a tenant gives (sessionId, userId, agentId, workspaceId, a memory's owner, a memory
id it picks) becomes `<tenant>/<id>` before it reaches Kafka, and loses that prefix on the
way out. An id holding the separator is refused, so no id of one tenant can spell another
tenant's: tenant B naming user "alice" writes and recalls as "B/alice", never "A/alice".
Memory ids the pipeline makes (`kind:hash`, e.g. "seg:…", "fact:…") are hashes of such
namespaced ids; they pass through as they are, and a tenant may not pick an id of that form.

Pure: reading the token file and every Kafka call are in `mnemoflow.streams.gateway`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from mnemoflow.agents.observer import ID_MAX_BYTES

SEP = "/"
PIPELINE_ID = ":"  # in every id the pipeline makes (agents.ids.stable_id), in no tenant's
LOCAL = "local"  # the one tenant of a gateway run without tokens, on a loopback address only
TOKEN_MIN_CHARS = 16
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPACE = re.compile(r"\s")


class TenancyError(ValueError):
    """A token table, tenant name or id the gateway refuses; the message is one line that
    names the field and why (never a token)."""


# ------------------------------------------------------------------------------ tokens


def token_digest(token: str) -> str:
    """Tokens are kept and looked up by digest only: a timing difference in the lookup then
    says nothing about a valid token's characters, and no token sits in memory as text."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_tenant(name: object) -> str:
    if not isinstance(name, str) or not _TENANT.fullmatch(name):
        raise TenancyError(f"tenant name {name!r} is not valid: expected 1-64 characters of "
                           f"A-Z a-z 0-9 . _ - starting with a letter or digit")
    return name


def token_table(raw: Mapping[str, Any]) -> dict[str, str]:
    """`{token: tenant}` as configured -> `{token digest: tenant}`. Several tokens may name
    one tenant (rotation). TenancyError names the bad entry by position, never the token."""
    table: dict[str, str] = {}
    for i, (token, tenant) in enumerate(raw.items(), 1):
        if not isinstance(token, str) or len(token) < TOKEN_MIN_CHARS or _SPACE.search(token):
            raise TenancyError(f"token #{i} (of tenant {tenant!r}) is not valid: expected at "
                               f"least {TOKEN_MIN_CHARS} characters and no whitespace")
        table[token_digest(token)] = check_tenant(tenant)
    return table


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def tenant_for(table: Mapping[str, str], header: str | None) -> str | None:
    """The tenant the request's Authorization header names; None when missing or unknown.
    An empty table is the tokenless local mode: every request is tenant LOCAL."""
    if not table:
        return LOCAL
    token = bearer_token(header)
    return table.get(token_digest(token)) if token is not None else None


# ------------------------------------------------------------------------------ binding


def host_of(header: str | None) -> str:
    """The host name of a Host header ("127.0.0.1:8088", "[::1]:8088", "localhost")."""
    h = (header or "").strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, has_tokens: bool) -> str | None:
    """Why the gateway must not listen on `host`, or None. Without tokens every caller is
    the one local tenant, which only the machine itself may reach."""
    if has_tokens or is_loopback(host):
        return None
    return (f"refusing to listen on {host} without tokens: every caller would be the one "
            f"local tenant; give --tokens FILE (or MNEMOFLOW_GATEWAY_TOKENS), or listen on "
            f"127.0.0.1")


# ------------------------------------------------------------------------------ ids


def scoped(tenant: str, value: str, field: str) -> str:
    """`<tenant>/<value>`; TenancyError when the value is empty, holds the separator or a
    control character, or would be over the pipeline's id bound once namespaced."""
    if not value:
        raise TenancyError(f"{field} is empty")
    if SEP in value:
        raise TenancyError(f"{field} {value!r} holds {SEP!r}, which the gateway reserves for "
                           f"its tenant namespace")
    bad = _CONTROL.search(value)
    if bad:
        raise TenancyError(f"{field} holds control character U+{ord(bad[0]):04X}")
    out = f"{tenant}{SEP}{value}"
    if len(out.encode("utf-8")) > ID_MAX_BYTES:
        raise TenancyError(f"{field} is too long: at most {ID_MAX_BYTES - len(tenant) - 1} "
                           f"bytes for tenant {tenant}")
    return out


def scoped_opt(tenant: str, value: str | None, field: str) -> str | None:
    return None if value is None else scoped(tenant, value, field)


def unscoped(tenant: str, value: str | None) -> str | None:
    """The tenant's own id back; None for an id of another tenant (or of no tenant). An empty
    id (a host fact's session, say) stays empty."""
    if not value:
        return value
    prefix = tenant + SEP
    return value[len(prefix):] if value.startswith(prefix) else None


def _check_memory_id(memory_id: str) -> str:
    if not memory_id or "," in memory_id:  # feedback joins memory ids with ','
        raise TenancyError(f"memoryId {memory_id!r} is not valid: expected a non-empty id "
                           f"without ','")
    return memory_id


def new_memory_id(tenant: str, memory_id: str) -> str:
    """A memory id a tenant picks for a memory it writes. The pipeline's form is refused: it
    would let one tenant write over another's memory of that id."""
    if PIPELINE_ID in _check_memory_id(memory_id):
        raise TenancyError(f"memoryId {memory_id!r} holds {PIPELINE_ID!r}, which only ids the "
                           f"pipeline makes hold")
    return scoped(tenant, memory_id, "memoryId")


def memory_ref(tenant: str, memory_id: str) -> str:
    """A memory id a tenant names (to revoke it, in feedback or tool memoryRefs): the
    pipeline's ids as they are, the tenant's own picked ids namespaced."""
    if PIPELINE_ID in _check_memory_id(memory_id):
        if SEP in memory_id or _CONTROL.search(memory_id):
            raise TenancyError(f"memoryId {memory_id!r} is not an id the gateway gave out")
        return memory_id
    return new_memory_id(tenant, memory_id)


def unscoped_memory_id(tenant: str, memory_id: str) -> str | None:
    """A memory id as the tenant sees it; None for another tenant's picked id."""
    return unscoped(tenant, memory_id) if SEP in memory_id else memory_id


def _unscoped_text(tenant: str, text: str) -> str:
    """Provenance is made of ids ("<sessionId>#<turn>.<step>", "host:<owner>@<time>"): the
    tenant's prefix is taken out wherever an id starts."""
    return re.sub(rf"(?<![A-Za-z0-9._-]){re.escape(tenant + SEP)}", "", text)


def unscoped_packet(tenant: str, packet: dict[str, Any]) -> dict[str, Any] | None:
    """A packet of one of the tenant's sessions as the tenant sees it, or None.

    An item that is not wholly the tenant's (owner, source session, memory id) is left out,
    and a packet left with no item is None: scope filtering in recall already keeps other
    tenants' memories out, and this keeps them out of the tenant's view whatever happens."""
    sid = unscoped(tenant, packet.get("sessionId"))
    if not sid:
        return None
    items = []
    for it in packet.get("items", ()):
        owner = unscoped(tenant, it.get("owner"))
        source = unscoped(tenant, it.get("sourceSessionId"))
        mid = unscoped_memory_id(tenant, it.get("memoryId", ""))
        if not owner or source is None or not mid:
            continue
        items.append({**it, "owner": owner, "sourceSessionId": source, "memoryId": mid,
                      "provenance": _unscoped_text(tenant, it.get("provenance") or "")})
    return {**packet, "sessionId": sid, "items": items} if items else None
