"""Upstream-shaped error bodies, byte for byte (the JSON itself: `troupe.api.dumps`).

``format_error_response`` in llama.cpp orders keys code, message, type; the global
middleware errors (401, 404, 503 "Loading model") order them message, type, code.
Clients and scripts compare these, so both orders are kept.

Every 404 reads "File Not Found", whatever the handler meant to say: llama-server's
HTTP library runs its error handler on any 404 and replaces the body (checked on the
pinned build: ``POST /models/load`` of an unknown model answers exactly that).
"""

from __future__ import annotations

from troupe.api import dumps
from troupe.sched.effects import Failure

__all__ = [
    "NOT_FOUND_BODY",
    "error_body",
    "failure_body",
    "middleware_error_body",
    "status_of",
]

_STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
    "exceed_context_size_error": 400,
}


def status_of(type_: str) -> int:
    """The HTTP status upstream gives an error type (500 for one it does not know)."""
    return _STATUS_OF_TYPE.get(type_, 500)


NOT_FOUND_BODY = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'


def error_body(message: str, type_: str) -> bytes:
    """``{"error":{"code":..,"message":..,"type":..}}`` (format_error_response)."""
    code = status_of(type_)
    if code == 404:
        return NOT_FOUND_BODY
    return dumps({"error": {"code": code, "message": message, "type": type_}})


def failure_body(failure: Failure) -> bytes:
    if failure.status == 404:
        return NOT_FOUND_BODY
    code = failure.code if failure.code is not None else failure.status
    return dumps({"error": {"code": code, "message": failure.message, "type": failure.type}})


def middleware_error_body(message: str, type_: str, code: int) -> bytes:
    """The global middleware's order: message, type, code."""
    return dumps({"error": {"message": message, "type": type_, "code": code}})
