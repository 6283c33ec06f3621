"""The gateway's tenancy rules (agents/tenancy.py): tokens, binding, namespacing in and out."""

from __future__ import annotations

import pytest

from mnemoflow.agents import tenancy as TN

TOKEN_A = "token-of-acme-0123456789"
TOKEN_B = "token-of-bravo-0123456789"


def test_token_table_keeps_digests_and_names_a_bad_entry_without_its_token() -> None:
    table = TN.token_table({TOKEN_A: "acme", TOKEN_B: "bravo", TOKEN_A + "-2": "acme"})
    assert TOKEN_A not in table and set(table.values()) == {"acme", "bravo"}
    with pytest.raises(TN.TenancyError, match=r"token #2 \(of tenant 'bravo'\)") as err:
        TN.token_table({TOKEN_A: "acme", "short": "bravo"})
    assert "short" not in str(err.value).replace("'bravo'", "")
    with pytest.raises(TN.TenancyError, match="whitespace"):
        TN.token_table({"a token with spaces in it": "acme"})
    for bad in ("", "a/b", "-x", "x" * 65, "tab\tx", 7):
        with pytest.raises(TN.TenancyError, match="tenant name"):
            TN.token_table({TOKEN_A: bad})


def test_bearer_header_names_the_tenant() -> None:
    table = TN.token_table({TOKEN_A: "acme", TOKEN_B: "bravo"})
    assert TN.tenant_for(table, f"Bearer {TOKEN_A}") == "acme"
    assert TN.tenant_for(table, f"bearer  {TOKEN_B} ") == "bravo"
    for header in (None, "", "Bearer", f"Basic {TOKEN_A}", f"Bearer {TOKEN_A}x", TOKEN_A):
        assert TN.tenant_for(table, header) is None
    assert TN.tenant_for({}, None) == TN.LOCAL  # no tokens: the one local tenant


def test_binding_elsewhere_than_loopback_needs_tokens() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert TN.bind_refusal(host, has_tokens=False) is None
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.com"):
        assert "without tokens" in (TN.bind_refusal(host, has_tokens=False) or "")
        assert TN.bind_refusal(host, has_tokens=True) is None
    assert [TN.host_of(h) for h in ("127.0.0.1:8088", "[::1]:8088", "localhost", "[::1]",
                                    "Evil.example:80", None)] == [
        "127.0.0.1", "::1", "localhost", "::1", "evil.example", ""]


def test_ids_are_namespaced_and_the_separator_is_refused() -> None:
    assert TN.scoped("acme", "alice", "userId") == "acme/alice"
    assert TN.unscoped("acme", "acme/alice") == "alice"
    assert TN.unscoped("bravo", "acme/alice") is None  # another tenant's id is never shown
    assert TN.unscoped("acme", "acmex/alice") is None and TN.unscoped("acme", "alice") is None
    assert TN.unscoped("acme", "") == "" and TN.scoped_opt("acme", None, "workspaceId") is None
    for bad, why in (("", "empty"), ("bravo/alice", "holds '/'"), ("a\nb", "control"),
                     ("x" * 251, "too long")):
        with pytest.raises(TN.TenancyError, match=why):
            TN.scoped("acme", bad, "userId")
    assert TN.scoped("acme", "x" * 250, "userId")  # 255 bytes namespaced: the observer's bound


def test_memory_ids_picked_by_a_tenant_never_take_the_pipelines_form() -> None:
    assert TN.new_memory_id("acme", "editor") == "acme/editor"
    for bad in ("fact:0123", "a,b", ""):
        with pytest.raises(TN.TenancyError):
            TN.new_memory_id("acme", bad)
    # naming a memory: the pipeline's ids as they are, picked ones namespaced
    assert TN.memory_ref("acme", "seg:abc") == "seg:abc"
    assert TN.memory_ref("acme", "editor") == "acme/editor"
    with pytest.raises(TN.TenancyError):
        TN.memory_ref("acme", "bravo/seg:abc")
    assert TN.unscoped_memory_id("acme", "seg:abc") == "seg:abc"
    assert TN.unscoped_memory_id("acme", "acme/editor") == "editor"
    assert TN.unscoped_memory_id("acme", "bravo/editor") is None


def _packet(sid: str, *items: dict) -> dict:
    return {"packetId": "pkt:1", "sessionId": sid, "strength": "soft_hint", "items": list(items)}


def _item(owner: str, source: str, mid: str = "seg:1", provenance: str = "") -> dict:
    return {"memoryId": mid, "text": "locker code zq042x", "owner": owner, "scope": "User",
            "sourceSessionId": source, "provenance": provenance}


def test_a_packet_goes_out_in_the_tenants_own_ids() -> None:
    pk = _packet("acme/s-ask", _item("acme/alice", "acme/s-mem", provenance="acme/s-mem#1.0"),
                 _item("acme/alice", "", "acme/editor", "host:acme/alice@5"))
    out = TN.unscoped_packet("acme", pk)
    assert out is not None and out["sessionId"] == "s-ask"
    assert [(i["owner"], i["sourceSessionId"], i["memoryId"], i["provenance"]) for i in out["items"]] \
        == [("alice", "s-mem", "seg:1", "s-mem#1.0"), ("alice", "", "editor", "host:alice@5")]
    assert pk["items"][0]["owner"] == "acme/alice"  # the input is not changed


def test_another_tenants_items_never_go_out() -> None:
    mixed = _packet("acme/s", _item("acme/alice", "acme/s1"), _item("bravo/alice", "bravo/s1"),
                    _item("acme/alice", "bravo/s2"), _item("acme/alice", "acme/s3", "bravo/x"))
    out = TN.unscoped_packet("acme", mixed)
    assert out is not None and [i["sourceSessionId"] for i in out["items"]] == ["s1"]
    assert TN.unscoped_packet("acme", _packet("acme/s", _item("bravo/alice", "bravo/s1"))) is None
    assert TN.unscoped_packet("bravo", _packet("acme/s", _item("acme/alice", "acme/s1"))) is None


def test_only_a_prefix_where_an_id_starts_is_taken_out_of_provenance() -> None:
    pk = _packet("acme/s", _item("acme/alice", "acme/s1", provenance="host:acme/bigacme/x#1.0"))
    out = TN.unscoped_packet("acme", pk)
    assert out is not None and out["items"][0]["provenance"] == "host:bigacme/x#1.0"
