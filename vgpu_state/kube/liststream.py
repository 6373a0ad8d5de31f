"""A list of objects read page by page, each page decoded one object at a time as it arrives.

``GET`` with ``limit`` and ``continue`` (as kubectl's ``--chunk-size``); the response
body is read in pieces (:meth:`~vgpu_state.kube.api.KubeApi.get_chunks`) and its
``items`` are decoded one by one as their text is complete, so a reader holds the
object being decoded and what it chooses to keep of the others, never a page's
text or a page of decoded objects. A page is read to its end before its objects
are worked on (:func:`stream_pages`): a slow consumer never keeps the API server's
answer open.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

from vgpu_state.kube.api import JsonObject, KubeApi
from vgpu_state.kube.errors import ClusterError

T = TypeVar("T")

_JSON = json.JSONDecoder()
_BLANK = " \t\n\r"
_COMPACT = 1024 * 1024
"""Decoded text dropped from the buffer once this much of it is behind the reader."""


class _ListReader:
    """The objects of one list response, decoded as its pieces arrive; :attr:`metadata`
    (the list's, with its continue token) once the body is read."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._at = 0
        self._eof = False
        self.metadata: dict[str, Any] = {}

    def _read(self) -> None:
        """At least one more piece (doubling what is unread, so that retried decodes
        of a large object cost linear time); raises at the end of the body."""
        if self._eof:
            raise ClusterError("the API server's list response ends in the middle")
        if self._at > _COMPACT:
            self._text = self._text[self._at :]
            self._at = 0
        wanted = max(len(self._text) - self._at, 1)
        got = 0
        parts = [self._text]
        for piece in self._pieces:
            text = self._utf8.decode(piece)
            parts.append(text)
            got += len(text)
            if got >= wanted:
                break
        else:
            self._eof = True
            parts.append(self._utf8.decode(b"", final=True))
        self._text = "".join(parts)

    def _char(self) -> str:
        """The next character that is not blank (not consumed)."""
        while True:
            while self._at < len(self._text) and self._text[self._at] in _BLANK:
                self._at += 1
            if self._at < len(self._text):
                return self._text[self._at]
            self._read()

    def _expect(self, char: str) -> None:
        found = self._char()
        if found != char:
            raise ClusterError(
                f"the API server sent a list that is not JSON: {char!r} expected, {found!r} found"
            )
        self._at += 1

    def _value(self) -> Any:
        self._char()
        while True:
            try:
                value, end = _JSON.raw_decode(self._text, self._at)
            except ValueError as e:
                if self._eof:
                    raise ClusterError(
                        f"the API server sent a list that is not JSON: {e}"
                    ) from None
                self._read()
                continue
            if end == len(self._text) and not self._eof and not isinstance(value, dict | list):
                self._read()  # a number or literal may go on in the next piece
                continue
            self._at = end
            return value

    def objects(self) -> Iterator[JsonObject]:
        """The list's ``items``, one at a time."""
        self._expect("{")
        while self._char() != "}":
            key = self._value()
            self._expect(":")
            if key == "items" and self._char() == "[":
                self._at += 1
                while self._char() != "]":
                    item = self._value()
                    if isinstance(item, dict):
                        yield item
                    del item
                    if self._char() == ",":
                        self._at += 1
                self._at += 1
            else:
                value = self._value()
                if key == "metadata" and isinstance(value, dict):
                    self.metadata = value
            if self._char() == ",":
                self._at += 1
        self._at += 1


def stream_objects(
    api: KubeApi, path: str, chunk_size: int, accept: str = "application/json"
) -> Iterator[JsonObject]:
    """Every object of the collection at ``path``, one at a time, ``chunk_size`` per
    request, each decoded when the consumer asks for it (none of the others held): a
    consumer that works on each one long keeps the API server's answer open that long
    (see :func:`stream_pages`)."""
    token = ""
    while True:
        pieces, reader = _request(api, path, chunk_size, token, accept)
        try:
            yield from reader.objects()
        finally:
            pieces.close()
        token = str(reader.metadata.get("continue") or "")
        if not token:
            return


def stream_pages(
    api: KubeApi,
    path: str,
    chunk_size: int,
    keep: Callable[[JsonObject], T],
    accept: str = "application/json",
    on_version: Callable[[str], None] | None = None,
) -> Iterator[list[T]]:
    """The collection at ``path`` page by page (``chunk_size`` objects per request), each
    page as ``keep(obj)`` of its objects, called as each object is decoded; the object is
    dropped after, and the page's answer is read to its end before the page is handed
    on. Raises the API's errors; a continue token that expired while the list was read
    (HTTP 410) says so. ``on_version`` is told the list's ``resourceVersion`` (a watch
    from it sees every change after the list) once the first page is read."""
    token = ""
    while True:
        pieces, reader = _request(api, path, chunk_size, token, accept)
        try:
            kept = [keep(obj) for obj in reader.objects()]
        finally:
            pieces.close()
        if not token and on_version is not None:
            on_version(str(reader.metadata.get("resourceVersion") or ""))
        token = str(reader.metadata.get("continue") or "")
        yield kept
        del kept
        if not token:
            return


def _request(
    api: KubeApi, path: str, chunk_size: int, token: str, accept: str
) -> tuple[Generator[bytes, None, None], _ListReader]:
    query = {"limit": str(chunk_size)}
    if token:
        query["continue"] = token
    try:
        pieces = api.get_chunks(path, query=query, accept=accept)
        first = next(pieces, b"")  # sends the request: its refusal is raised here
    except ClusterError as e:
        if e.status == 410:
            raise ClusterError(
                f"{e} (the list took longer than the API server keeps its snapshot)",
                e.status,
                e.api_reason,
            ) from None
        raise

    def body() -> Iterator[bytes]:
        yield first
        yield from pieces

    return pieces, _ListReader(body())
