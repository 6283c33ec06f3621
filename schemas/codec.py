"""Avro single-object encoding (0xC3 0x01, CRC-64-AVRO fingerprint, body) with fastavro.

Why single-object: any Avro reader that knows the schema set can resolve a record from its
fingerprint alone, and a v1.1 reader can still read v1 records (schema resolution).
"""

from __future__ import annotations

import copy
import io
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

MAGIC = b"\xc3\x01"
HEADER_LEN = 10

_CRC64_EMPTY = 0xC15D213AA4D7A795


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc64_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin fingerprint that the Avro spec names CRC-64-AVRO."""
    fp = _CRC64_EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


class DecodeError(Exception):
    """A record that cannot be taken; `reason` is the dead-letter reason code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RegisteredSchema:
    name: str
    parsed: Any
    canonical: str
    fingerprint: int
    # parsed with fastavro's write hint: without it every read and write parses the schema
    # again, which made encode/decode ~3x slower on the stream's hot path
    hinted: Any = None
    header: bytes = b""


def _inline(node: Any, named: dict[str, dict[str, Any]], seen: set[str]) -> Any:
    """Replace the first use of each named type with its definition (later uses stay names)."""
    if isinstance(node, str):
        if node in named and node not in seen:
            seen.add(node)
            return _inline(copy.deepcopy(named[node]), named, seen)
        return node
    if isinstance(node, list):
        return [_inline(n, named, seen) for n in node]
    if isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            full = _full_name(node)
            seen.add(full)
        out = {}
        for k, v in node.items():
            if k in ("type", "items", "values", "fields"):
                out[k] = _inline(v, named, seen)
            else:
                out[k] = v
        return out
    return node


def _full_name(node: dict[str, Any]) -> str:
    name = node["name"]
    ns = node.get("namespace")
    return name if "." in name or not ns else f"{ns}.{name}"


class SchemaRegistry:
    """Schemas by name and by fingerprint; several versions of one name may be registered."""

    def __init__(self) -> None:
        self._by_fp: dict[int, RegisteredSchema] = {}
        self._current: dict[str, RegisteredSchema] = {}

    def register(self, schema: dict[str, Any], current: bool = True) -> RegisteredSchema:
        parsed = fastavro.parse_schema(copy.deepcopy(schema), _write_hint=False)
        canonical = to_parsing_canonical_form(parsed)
        fp = crc64_avro(canonical.encode())
        reg = RegisteredSchema(_full_name(schema), parsed, canonical, fp,
                               fastavro.parse_schema(copy.deepcopy(schema)),
                               MAGIC + struct.pack("<Q", fp))
        self._by_fp[fp] = reg
        if current:
            self._current[reg.name] = reg
        return reg

    def schema(self, name: str) -> RegisteredSchema:
        return self._current[name]

    def names(self) -> Iterable[str]:
        return self._current.keys()

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        reg = self._current[name]
        buf = io.BytesIO()
        buf.write(reg.header)
        fastavro.schemaless_writer(buf, reg.hinted, record)
        return buf.getvalue()

    def decode(self, data: bytes | None, expect: str | None = None) -> tuple[str, dict[str, Any]]:
        """Decode with the writer's schema and resolve to our current version of that name."""
        if data is None or len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise DecodeError("bad-magic", "not Avro single-object encoded")
        (fp,) = struct.unpack("<Q", data[2:HEADER_LEN])
        writer = self._by_fp.get(fp)
        if writer is None:
            raise DecodeError("unknown-fingerprint", f"{fp:016x}")
        if expect is not None and writer.name != expect:
            raise DecodeError("wrong-type", f"{writer.name} where {expect} was expected")
        reader = self._current.get(writer.name, writer)
        buf = io.BytesIO(data[HEADER_LEN:])
        try:
            rec = fastavro.schemaless_reader(
                buf, writer.hinted, reader.hinted if reader is not writer else None
            )
        except Exception as exc:  # fastavro raises many types on corrupt bodies
            raise DecodeError("undecodable", f"{type(exc).__name__}: {exc}"[:300]) from exc
        if buf.tell() != len(data) - HEADER_LEN:
            raise DecodeError("undecodable", "trailing bytes after the record")
        return writer.name, rec  # type: ignore[return-value]


def _load_json(name: str) -> dict[str, Any]:
    return json.loads(resources.files("mnemoflow.schemas").joinpath(name).read_text())


def named_types() -> dict[str, dict[str, Any]]:
    """The shared record types under schemas/types/, by full name."""
    out = {}
    for entry in resources.files("mnemoflow.schemas").joinpath("types").iterdir():
        if entry.name.endswith(".avsc"):
            node = json.loads(entry.read_text())
            out[_full_name(node)] = node
    return out


def topic_schema(filename: str) -> dict[str, Any]:
    """A topic value schema, self-contained (shared types inlined), ready to parse."""
    return _inline(_load_json(filename), named_types(), set())


def default_registry() -> SchemaRegistry:
    """Every topic value schema of this release, plus the shared record types."""
    reg = SchemaRegistry()
    for entry in sorted(resources.files("mnemoflow.schemas").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            reg.register(topic_schema(entry.name))
    types = named_types()
    for name in sorted(types):
        reg.register(_inline(types[name], types, set()))
    # earlier versions still on the topics: decodable (resolved to the current version), never
    # written; a rolling upgrade would otherwise dead-letter records already in flight
    history = resources.files("mnemoflow.schemas").joinpath("history")
    if history.is_dir():
        for entry in sorted(history.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".avsc"):
                reg.register(_inline(json.loads(entry.read_text()), types, set()), current=False)
    return reg
