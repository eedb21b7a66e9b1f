"""Ollama's routes, for the one route table (`troupe.http.routing.RouteTable.extended`).

Exact (method, path) entries only, so an OpenAI route's lookup stays the one dict
lookup it was. Handlers that wait (on the scheduler, a child, the hub) are `watched`:
a client that goes away cancels them.
"""

from __future__ import annotations

from troupe.http.respond import watched
from troupe.http.routing import Handler, Under
from troupe.ollama import generate, models

__all__ = ["OLLAMA_ROUTES", "OLLAMA_UNDER"]

_CREATE = (
    "troupe cannot create models: it serves GGUF files from its catalogue (a models "
    "directory, presets, the Hugging Face cache); put the file there, or set the "
    "parameters in the model's preset"
)
_PUSH = "troupe cannot push models: it pulls from the Hugging Face hub only"
_COPY = "troupe cannot copy models: give the model an alias in its preset instead"
_BLOBS = "troupe has no blob store: put GGUF files in its models directory"

OLLAMA_ROUTES: list[tuple[tuple[str, str], Handler]] = [
    (("GET", "/"), models.root),
    (("HEAD", "/"), models.root),
    (("GET", "/api/version"), models.version),
    (("GET", "/api/tags"), models.tags),
    (("GET", "/api/ps"), models.ps),
    (("POST", "/api/show"), models.show),
    (("POST", "/api/chat"), watched(generate.chat)),
    (("POST", "/api/generate"), watched(generate.generate)),
    (("POST", "/api/embed"), watched(generate.embed)),
    (("POST", "/api/embeddings"), watched(generate.embeddings)),
    (("POST", "/api/pull"), watched(models.pull)),
    (("DELETE", "/api/delete"), watched(models.delete)),
    (("POST", "/api/create"), models.unsupported(_CREATE)),
    (("POST", "/api/push"), models.unsupported(_PUSH)),
    (("POST", "/api/copy"), models.unsupported(_COPY)),
]
OLLAMA_UNDER = [
    Under("HEAD", "/api/blobs/", models.unsupported(_BLOBS), segment=True),
    Under("POST", "/api/blobs/", models.unsupported(_BLOBS), segment=True),
]
