"""Ollama's routes, for the one route table (`troupe.http.routing.RouteTable.extended`).

Exact (method, path) entries only, so an OpenAI route's lookup stays the one dict
lookup it was. Handlers that wait (on the scheduler, a child, the hub) are `watched`:
a client that goes away cancels them. The router's own answers get an access record
of kind "local" (`recorded`); a generation's is its lease's (kind "proxied").
"""

from __future__ import annotations

from troupe.http.access import recorded
from troupe.http.respond import watched
from troupe.http.routing import Handler, Under
from troupe.ollama import generate, models

__all__ = ["OLLAMA_ROUTES", "OLLAMA_UNDER"]

_CREATE = (
    "troupe cannot create models: it serves GGUF files from its catalog (a models "
    "directory, presets, the Hugging Face cache); put the file there, or set the "
    "parameters in the model's preset"
)
_PUSH = "troupe cannot push models: it pulls from the Hugging Face hub only"
_COPY = "troupe cannot copy models: give the model an alias in its preset instead"
_BLOBS = "troupe has no blob store: put GGUF files in its models directory"

OLLAMA_ROUTES: list[tuple[tuple[str, str], Handler]] = [
    (("GET", "/"), recorded(models.root)),
    (("HEAD", "/"), recorded(models.root)),
    (("GET", "/api/version"), recorded(models.version)),
    (("GET", "/api/tags"), recorded(models.tags)),
    (("GET", "/api/ps"), recorded(models.ps)),
    (("POST", "/api/show"), recorded(models.show)),
    (("POST", "/api/chat"), watched(generate.chat)),
    (("POST", "/api/generate"), watched(generate.generate)),
    (("POST", "/api/embed"), watched(generate.embed)),
    (("POST", "/api/embeddings"), watched(generate.embeddings)),
    (("POST", "/api/pull"), recorded(watched(models.pull))),
    (("DELETE", "/api/delete"), recorded(watched(models.delete))),
    (("POST", "/api/create"), recorded(models.unsupported(_CREATE))),
    (("POST", "/api/push"), recorded(models.unsupported(_PUSH))),
    (("POST", "/api/copy"), recorded(models.unsupported(_COPY))),
]
OLLAMA_UNDER = [
    Under("HEAD", "/api/blobs/", models.unsupported(_BLOBS), segment=True),
    Under("POST", "/api/blobs/", models.unsupported(_BLOBS), segment=True),
]
