"""The protobuf wire format, as much of it as the kubelet's messages to and from the agent use.

The device plugin (``v1beta1``) and the pod-resources client (``v1``) speak
protobuf over gRPC; the messages they send and read are few and flat, so they
are written and read here, field by field, and the agent's process never loads
the protobuf runtime. What is read comes from the kubelet's socket and is
checked before it is believed:

* a varint is at most 10 bytes, a length never runs past the end of its message,
  a field number is in range and a wire type is one of the four proto3 has
  (the groups of proto2 are refused);
* a field this code does not know is skipped unread (its nested messages are
  never parsed), so nesting is only as deep as the known messages' own
  (:data:`MAX_DEPTH` bounds it);
* a repeated field holds at most :data:`MAX_REPEATED` items, a string is UTF-8.

Every refusal is a :class:`WireError` naming the message's field and the byte.
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_REPEATED = 10_000
"""Items a repeated field may hold (a node's devices, pods, a container's device IDs)."""
MAX_DEPTH = 8
"""Messages within messages, the outermost being 1."""

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5
_MAX_FIELD = (1 << 29) - 1
_U64 = (1 << 64) - 1


class WireError(ValueError):
    """A message that is not what its type says: names the field and the byte offset."""


# -- writing ------------------------------------------------------------------


def varint(value: int) -> bytes:
    """``value`` as a varint (a negative one as its 64-bit two's complement, 10 bytes)."""
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def integer(number: int, value: int) -> bytes:
    """An int32, int64 or bool field (nothing for 0, proto3's default)."""
    return _key(number, VARINT) + varint(value) if value else b""


def boolean(number: int, value: bool) -> bytes:
    return integer(number, int(value))


def string(number: int, value: str) -> bytes:
    """A string field (nothing for ``""``)."""
    return length_delimited(number, value.encode()) if value else b""


def strings(number: int, values: list[str] | tuple[str, ...]) -> bytes:
    """A repeated string field: each item, the empty ones too."""
    return b"".join(length_delimited(number, v.encode()) for v in values)


def message(number: int, encoded: bytes) -> bytes:
    """A message field that is set (even when every field of it is the default)."""
    return length_delimited(number, encoded)


def length_delimited(number: int, data: bytes) -> bytes:
    return _key(number, LEN) + varint(len(data)) + data


def string_map(number: int, values: dict[str, str]) -> bytes:
    """A ``map<string, string>`` field: one entry message (key 1, value 2) per item."""
    return b"".join(message(number, string(1, k) + string(2, v)) for k, v in values.items())


# -- reading ------------------------------------------------------------------


class Reader:
    """The fields of one message, in order: ``(number, wire type, value)``.

    ``value`` is an ``int`` for a varint or a fixed-size field and ``bytes`` for a
    length-delimited one. ``name`` is the message's path (``AllocateRequest`` or
    ``AllocateRequest.container_requests[2]``) for errors; ``depth`` its nesting.
    """

    def __init__(self, data: bytes, name: str, depth: int = 1) -> None:
        if depth > MAX_DEPTH:
            raise WireError(f"{name}: nested deeper than {MAX_DEPTH} messages")
        self.data = bytes(data)
        self.name = name
        self.depth = depth
        self._counts: dict[int, int] = {}

    def __iter__(self) -> Iterator[tuple[int, int, int | bytes]]:
        data, end, pos = self.data, len(self.data), 0
        while pos < end:
            at = pos
            key, pos = self._varint(pos, "a field's key")
            number, wire_type = key >> 3, key & 7
            if not 1 <= number <= _MAX_FIELD:
                raise WireError(f"{self.name}: field number {number} at byte {at} is out of range")
            if wire_type == VARINT:
                value, pos = self._varint(pos, f"field {number}")
                yield number, wire_type, value
            elif wire_type == LEN:
                size, pos = self._varint(pos, f"field {number}'s length")
                if size > end - pos:
                    raise WireError(
                        f"{self.name}: field {number} at byte {at} is {size} bytes long, "
                        f"past the message's end ({end - pos} left)"
                    )
                yield number, wire_type, data[pos : pos + size]
                pos += size
            elif wire_type in (FIXED64, FIXED32):
                size = 8 if wire_type == FIXED64 else 4
                if size > end - pos:
                    raise WireError(f"{self.name}: field {number} at byte {at} is cut short")
                yield number, wire_type, int.from_bytes(data[pos : pos + size], "little")
                pos += size
            else:
                raise WireError(
                    f"{self.name}: field {number} at byte {at} has wire type {wire_type}, "
                    "which proto3 does not use"
                )

    def _varint(self, pos: int, what: str) -> tuple[int, int]:
        data, result, shift, start = self.data, 0, 0, pos
        while True:
            if pos >= len(data):
                raise WireError(f"{self.name}: {what} at byte {start} is cut short")
            if pos - start >= 10:
                raise WireError(f"{self.name}: {what} at byte {start} is longer than 10 bytes")
            b = data[pos]
            result |= (b & 0x7F) << shift
            pos += 1
            if not b & 0x80:
                return result & _U64, pos
            shift += 7

    # typed access to one field's value ------------------------------------------

    def _expect(self, number: int, field: str, wire_type: int, want: int) -> None:
        if wire_type != want:
            raise WireError(
                f"{self.name}.{field} (field {number}) has wire type {wire_type}, not {want}"
            )

    def count(self, number: int, field: str) -> int:
        """Count one more item of a repeated field; refuse more than :data:`MAX_REPEATED`."""
        n = self._counts.get(number, 0) + 1
        if n > MAX_REPEATED:
            raise WireError(f"{self.name}.{field} has more than {MAX_REPEATED} items")
        self._counts[number] = n
        return n - 1

    def string(self, number: int, field: str, wire_type: int, value: int | bytes) -> str:
        self._expect(number, field, wire_type, LEN)
        assert isinstance(value, bytes)
        try:
            return value.decode()
        except UnicodeDecodeError as e:
            raise WireError(
                f"{self.name}.{field} is not UTF-8 ({e.reason} at byte {e.start})"
            ) from e

    def integer(self, number: int, field: str, wire_type: int, value: int | bytes) -> int:
        """An int32 or int64 (the varint read as signed 64-bit)."""
        self._expect(number, field, wire_type, VARINT)
        assert isinstance(value, int)
        return value - (1 << 64) if value >> 63 else value

    def boolean(self, number: int, field: str, wire_type: int, value: int | bytes) -> bool:
        self._expect(number, field, wire_type, VARINT)
        return bool(value)

    def message(
        self, number: int, field: str, wire_type: int, value: int | bytes, index: int | None = None
    ) -> Reader:
        """A nested message's reader (``index``: its place in a repeated field)."""
        self._expect(number, field, wire_type, LEN)
        assert isinstance(value, bytes)
        where = f"{field}[{index}]" if index is not None else field
        return Reader(value, f"{self.name}.{where}", self.depth + 1)
