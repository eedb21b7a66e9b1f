"""A differential fuzzer for troupe's request parser, with h11 as the oracle.

`requests()` is a Hypothesis strategy of raw request bytes near the edge of what
HTTP/1.1 allows: odd methods, targets (origin, absolute, asterisk form, control
bytes), versions (0.9, 1.0, 1.1, 2.0), header names and values (whitespace, CR,
LF, NUL, obs-fold, duplicates of Host and Content-Length), line ends, bodies framed
by Content-Length (right or wrong) or chunked (extensions, trailers, bad sizes).

`compare(data)` feeds the bytes to troupe's `RequestParser` and to an h11 server
connection and reduces both to one `Outcome`: the first request (method, target,
headers, body), an error, or "incomplete". Where they differ, `explain` names the
difference if it is one of troupe's documented choices (`CHOICES`); anything else is
a disagreement to fix. The test suite runs a short budget
(tests/http/test_parser_fuzz.py), ``bench/fuzz_http.py --count N`` a long one.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import h11
from hypothesis import strategies as st

from troupe.http.server.parse import BadRequest, Refused, RequestParser

__all__ = ["CHOICES", "Outcome", "compare", "explain", "requests", "troupe_outcome"]

MAX_BODY = 1 << 20


@attrs.frozen
class Outcome:
    kind: str  # "request", "error", "incomplete"
    method: bytes = b""
    target: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    detail: str = ""

    def same(self, other: Outcome) -> bool:
        if self.kind != other.kind:
            return False
        if self.kind != "request":
            return True
        return (self.method, self.target, self.headers, self.body) == (
            other.method,
            other.target,
            other.headers,
            other.body,
        )


def _origin_form(target: bytes) -> bytes:
    """The target as troupe hands it on: an absolute form's path and query."""
    if target[:1] != b"/" and b"://" in target:
        rest = target.split(b"://", 1)[1]
        cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        origin = rest[cut:]
        return origin if origin.startswith(b"/") else b"/" + origin
    return target


def troupe_outcome(data: bytes) -> Outcome:
    parser = RequestParser(MAX_BODY)
    error: Outcome | None = None
    try:
        parser.feed(data)
    except BadRequest as exc:
        error = Outcome("error", detail=f"{exc.status} {exc.message}")
    except Refused as exc:
        error = Outcome("error", detail=f"{exc.refusal.status}")
    # Only the first request is compared (h11 stops there until it is answered): bytes
    # after it that are no request are that next request's business.
    if error is not None and not parser.ready:
        return error
    if not parser.ready:
        return Outcome("incomplete")
    r = parser.ready[0]
    headers = tuple((k, v.strip(b" \t")) for k, v in r.headers)
    return Outcome("request", r.method.encode(), r.target, headers, r.body)


def h11_outcome(data: bytes) -> Outcome:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=256 << 10)
    conn.receive_data(data)
    request: h11.Request | None = None
    body: list[bytes] = []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return Outcome("incomplete")
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
    except h11.RemoteProtocolError as exc:
        return Outcome("error", detail=str(exc))
    assert request is not None
    headers = tuple((bytes(k), bytes(v)) for k, v in request.headers.raw_items())
    headers = tuple((k.lower(), v) for k, v in headers)
    return Outcome(
        "request",
        bytes(request.method),
        _origin_form(bytes(request.target)),
        headers,
        b"".join(body),
    )


# ----- troupe's documented choices where it differs from h11 -----------------------------

Choice = Callable[[bytes, Outcome, Outcome], bool]


def _request_line(data: bytes) -> bytes:
    return data.lstrip(b"\r\n").split(b"\n", 1)[0]


def _unknown_method(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # llhttp knows the registered methods only; h11 takes any token. An unknown method
    # is a 400 here (no route has it), a 404 or 405 is all h11's answer could lead to.
    method = _request_line(data).split(b" ", 1)[0]
    return ours.kind == "error" and theirs.kind == "request" and method not in _KNOWN_METHODS


def _http2_preface(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # PRI, HTTP/2's preface (prior knowledge): troupe refuses it at once (llhttp alone
    # would wait for the rest of the preface until the head deadline); h11 takes PRI
    # as any other method.
    return _request_line(data).startswith(b"PRI ") and ours.kind == "error"


def _leading_empty_lines(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # RFC 9112 2.2: a server SHOULD ignore at least one empty line before the request
    # line; llhttp does (bounded by the head deadline), h11 refuses.
    return data[:1] in (b"\r", b"\n") and theirs.kind == "error"


def _version(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Versions other than 1.0 and 1.1 (HTTP/1.2, 2.0, 0.9): h11 parses any d.d; llhttp
    # refuses some, and troupe refuses 0.9. Either way nothing is served wrongly.
    line = _request_line(data).rstrip(b"\r")
    return ours.kind == "error" and not (line.endswith(b"HTTP/1.1") or line.endswith(b"HTTP/1.0"))


def _target_bytes(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Targets: troupe refuses some forms h11 takes (an absolute form with userinfo or
    # a scheme other than http(s), bytes llhttp does not allow in a path).
    parts = _request_line(data).split(b" ")
    target = parts[1] if len(parts) > 2 else b""
    odd = any(b < 0x21 or b > 0x7E for b in target) or b"://" in target or target[:1] != b"/"
    return odd and ours.kind == "error"


def _header_bytes(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Header values with bytes h11 refuses (DEL, 0x80-0xFF are obs-text, allowed by
    # RFC 9110; llhttp allows them, h11 too except some control bytes): llhttp is
    # stricter on some control bytes and h11 on others; each refusal is a 400.
    head = data.split(b"\r\n\r\n", 1)[0]
    odd = any((b < 0x20 and b not in (0x09, 0x0A, 0x0D)) or b == 0x7F for b in head)
    return odd and "error" in (ours.kind, theirs.kind)


def _duplicate_content_length(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Two Content-Length fields, or one with a list ("1, 1"), of the same value: RFC
    # 9110 8.6 lets a server take them as one (h11 does); llhttp refuses both, which
    # is safe.
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    lines = [ln for ln in head.split(b"\r\n") if ln.startswith(b"content-length")]
    listed = any(b"," in ln for ln in lines)
    return (len(lines) > 1 or listed) and ours.kind == "error"


def _chunked_and_length(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Transfer-Encoding with Content-Length: troupe refuses (request smuggling),
    # h11 takes the chunked framing (RFC 9112 6.1 allows either).
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    return b"transfer-encoding" in head and b"content-length" in head and ours.kind == "error"


def _transfer_coding(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Transfer-Encoding: troupe takes exactly "chunked" (400 or 501 otherwise, as h11);
    # where the rest of the head is odd too, which of the two answers first differs.
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    return b"transfer-encoding" in head and ours.kind == "error"


def _bare_lf(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # A bare LF as a line end: h11 accepts it (RFC 9112 2.2 MAY); llhttp refuses it in
    # the head, a stricter choice that cannot be smuggled through.
    head = data.split(b"\r\n\r\n", 1)[0]
    return b"\n" in head.replace(b"\r\n", b"") and ours.kind == "error"


def _obs_fold(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # A field line folded onto the next (obs-fold): RFC 9112 5.2 lets a server either
    # refuse it (400) or unfold it; llhttp refuses, h11 unfolds.
    head = data.split(b"\r\n\r\n", 1)[0]
    return (b"\r\n " in head or b"\r\n\t" in head) and ours.kind == "error"


def _request_line_spaces(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Runs of spaces between the request line's parts: llhttp takes them, h11 refuses
    # (RFC 9112 3: SHOULD be a 400). Only a choice if troupe reads the request exactly
    # as h11 reads it with single spaces (the upstream request line is rebuilt from
    # the parts, so nothing odd reaches a child).
    lead = len(data) - len(data.lstrip(b"\r\n"))
    line, eol, rest = data[lead:].partition(b"\r\n")
    tidy = b" ".join(part for part in line.split(b" ") if part)
    if tidy == line or ours.kind != "request":
        return False
    return ours.same(h11_outcome(data[:lead] + tidy + eol + rest)) or tidy.count(b" ") != 2


def _limits(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # troupe's limits (414 past 8 KiB of target, 431 past 100 fields or 64 KiB of head,
    # 413 past the body limit) are not h11's.
    return ours.detail[:3] in ("414", "431", "413")


def _host_count(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # Both refuse an HTTP/1.1 request without exactly one Host; which error each
    # names first when more is wrong differs (the kind agrees: an error).
    return False


def _incomplete_vs_error(data: bytes, ours: Outcome, theirs: Outcome) -> bool:
    # A head that is not finished: llhttp judges each byte as it comes and may refuse
    # an unfinished line h11 would wait for the end of (and the other way round).
    return {ours.kind, theirs.kind} == {"incomplete", "error"}


CHOICES: tuple[tuple[str, Choice], ...] = (
    ("limits", _limits),
    ("obs-fold", _obs_fold),
    ("request-line-spaces", _request_line_spaces),
    ("http2-preface", _http2_preface),
    ("unknown-method", _unknown_method),
    ("leading-empty-lines", _leading_empty_lines),
    ("version", _version),
    ("target-bytes", _target_bytes),
    ("header-bytes", _header_bytes),
    ("duplicate-content-length", _duplicate_content_length),
    ("chunked-and-length", _chunked_and_length),
    ("transfer-coding", _transfer_coding),
    ("bare-lf", _bare_lf),
    ("incomplete-vs-error", _incomplete_vs_error),
)

_KNOWN_METHODS = frozenset(
    b"DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND "
    b"PROPPATCH SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE "
    b"M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE "
    b"QUERY".split()
)


# The only choices by which troupe takes a request h11 refuses (leniency is where
# smuggling lives, so each is narrow); every other choice refuses more than h11.
LENIENT = frozenset({"leading-empty-lines", "request-line-spaces"})


def explain(data: bytes, ours: Outcome, theirs: Outcome) -> str | None:
    """The documented choice behind a difference, or None (a bug to fix)."""
    lenient = ours.kind == "request" and theirs.kind != "request"
    for name, choice in CHOICES:
        if lenient and name not in LENIENT:
            continue
        if choice(data, ours, theirs):
            return name
    return None


def compare(data: bytes) -> tuple[Outcome, Outcome, str | None]:
    """(troupe's, h11's, why they differ); why is "" when they agree."""
    ours, theirs = troupe_outcome(data), h11_outcome(data)
    if ours.same(theirs):
        return ours, theirs, ""
    return ours, theirs, explain(data, ours, theirs)


# ----- generating requests ---------------------------------------------------------------


def _mostly(valid: list[bytes], odd: list[bytes]) -> st.SearchStrategy[bytes]:
    """A valid value seven times in eight, an odd one otherwise."""
    return st.sampled_from(valid * (7 * max(1, len(odd)) // len(valid) + 1) + odd)


_TOKEN = _mostly(
    [b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"],
    [b"get", b"FROB", b"G T", b"", b"GET\x00", b"M-SEARCH", b"PRI"],
)
_PATH = _mostly(
    [b"/", b"/health", b"/v1/models", b"/a%20b", b"/x?y=1&z", b"/v1/chat/completions",
     b"/%ZZ", b"/" + b"a" * 300, b"/a/../b", b"/?"],
    [b"*", b"", b"/\xff", b"/a\x00b", b"/a b", b"http://h/x", b"http://h:80?q", b"HTTP://H/x",
     b"https://h", b"ftp://h/x", b"//x", b"h:80", b"/a\tb", b"http://u@h/x"],
)  # fmt: skip
_VERSION = _mostly(
    [b" HTTP/1.1", b" HTTP/1.0"],
    [b" HTTP/2.0", b" HTTP/1.2", b" http/1.1", b"", b" HTTP/1.1 ", b"  HTTP/1.1", b" HTTP/01.1",
     b" HTTP/0.9"],
)  # fmt: skip
_NAME = _mostly(
    [b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect",
     b"X-Api-Key", b"Authorization", b"X-A", b"Upgrade", b"Content-Type", b"Accept"],
    [b"X A", b"X:A", b"", b"X\x00", b"X\x7f", b"X\xff", b"X\"", b" X"],
)  # fmt: skip
_VALUE = st.one_of(
    *[st.sampled_from(
        [b"x", b"127.0.0.1", b"localhost:8080", b"0", b"5", b"chunked", b"close",
         b"keep-alive", b"100-continue", b" padded ", b"\tx", b"\xff\xfe", b"", b"Bearer k",
         b"a, b", b"text/plain; q=1"]
    )] * 6,
    st.sampled_from(
        [b"-1", b"abc", b"gzip, chunked", b"chunked, chunked", b"identity", b"a\x00b", b"a\rb",
         b"a\nb", b"a\x7fb", b"1, 1", b"+5", b"0x5", b"websocket"]
    ),
    st.binary(max_size=8),
)  # fmt: skip
_EOL = st.sampled_from([b"\r\n"] * 12 + [b"\n", b"\r"])


@st.composite
def _chunked_body(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(0, 3))):
        data = draw(st.binary(max_size=12))
        size = draw(st.sampled_from([b"%x" % len(data), b"%X" % len(data), b"zz", b"-1",
                                     b"%x " % len(data), b"0" + b"%x" % len(data)]))  # fmt: skip
        ext = draw(st.sampled_from([b"", b";a=b", b'; q="x"', b";\x00"]))
        out += size + ext + b"\r\n" + data + b"\r\n"
    out += b"0\r\n"
    for _ in range(draw(st.integers(0, 2))):
        out += draw(st.sampled_from([b"X-T: 1\r\n", b"Authorization: Bearer k\r\n", b"Bad\r\n"]))
    return out + draw(st.sampled_from([b"\r\n", b"\r\n", b""]))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """Raw request bytes near the edge of HTTP/1.1."""
    eol = draw(_EOL)
    line = draw(st.sampled_from([b""] * 8 + [b"\r\n", b"\n\r\n"]))
    line += draw(_TOKEN) + b" " + draw(_PATH) + draw(_VERSION) + eol
    fields = draw(st.lists(st.tuples(_NAME, _VALUE), max_size=4))
    if draw(st.integers(0, 4)):
        fields.insert(0, (b"Host", b"127.0.0.1"))
    framing = draw(st.sampled_from(["none", "length", "wrong-length", "chunked"]))
    body = draw(st.binary(max_size=16))
    if framing == "length":
        fields.append((b"Content-Length", b"%d" % len(body)))
    elif framing == "wrong-length":
        fields.append((b"Content-Length", b"%d" % (len(body) + draw(st.integers(-3, 3)))))
    elif framing == "chunked":
        fields.append((b"Transfer-Encoding", b"chunked"))
        body = draw(_chunked_body())
    sep = draw(st.sampled_from([b": ", b": ", b":", b" : ", b":\t"]))
    head = line + b"".join(k + sep + v + eol for k, v in fields)
    if draw(st.integers(0, 19)) == 0:
        head += b" folded" + eol  # obs-fold
    return head + eol + body
