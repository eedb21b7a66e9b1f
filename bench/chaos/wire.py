"""An HTTP/1.1 response parser for answers that may be odd (the raw client's)."""

from __future__ import annotations

import time


class Reader:
    """An HTTP/1.1 response parser for answers that may be odd: 1xx answers before the
    real one, bodies delimited by Content-Length, chunking or the connection's end."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.done = False
        self.first_body_at = 0.0
        self.mode = ""  # "length", "chunked" or "eof"
        self._left = 0  # body bytes (length) or chunk bytes still expected
        self._chunk_state = "size"  # size, data, crlf, trailers

    @property
    def streaming(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def feed(self, data: bytes) -> None:
        self.buf += data
        while not self.done:
            if not self.status and not self._head():
                return
            if not self._body():
                return

    def _head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > 1 << 20:
                raise ValueError("response head over 1 MiB")
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"bad status line {lines[0][:60]!r}")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            return True  # informational (100 Continue): the real answer follows
        self.status = status
        for line in lines[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in self.headers:
            self.mode, self._left = "length", int(self.headers["content-length"])
        elif status in (101, 204, 304):
            self.mode, self._left = "length", 0
        else:
            self.mode = "eof"
        return True

    def _take(self, data: bytes) -> None:
        if data:
            self.first_body_at = self.first_body_at or time.monotonic()
            self.body.append(data)

    def _body(self) -> bool:
        """Consume what the buffer holds; False when more bytes are needed."""
        if self.mode == "eof":
            self._take(bytes(self.buf))
            self.buf.clear()
            return False
        if self.mode == "length":
            n = min(self._left, len(self.buf))
            self._take(bytes(self.buf[:n]))
            del self.buf[:n]
            self._left -= n
            self.done = self._left == 0
            return self.done
        while True:
            if self._chunk_state in ("size", "trailers", "crlf"):
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return False
                line = bytes(self.buf[:eol])
                del self.buf[: eol + 2]
                if self._chunk_state == "crlf":
                    self._chunk_state = "size"
                elif self._chunk_state == "trailers":
                    if not line:
                        self.done = True
                        return True
                else:
                    self._left = int(line.split(b";", 1)[0].strip() or b"x", 16)
                    self._chunk_state = "data" if self._left else "trailers"
                continue
            n = min(self._left, len(self.buf))
            if n == 0:
                return False
            self._take(bytes(self.buf[:n]))
            del self.buf[:n]
            self._left -= n
            if self._left == 0:
                self._chunk_state = "crlf"
