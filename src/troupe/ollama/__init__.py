"""Ollama's HTTP API over troupe's catalog and children (``/api/*``, ``GET /``).

Requests take the OpenAI routes' path (the same validation, queue, lease, API key,
CORS and limits) and are translated to the child's ``/v1/chat/completions``,
``/completion``, ``/infill`` and ``/v1/embeddings``; answers are translated back to
Ollama's shapes, streamed as newline-delimited JSON.
"""

from troupe.ollama.routes import OLLAMA_ROUTES, OLLAMA_UNDER

__all__ = ["OLLAMA_ROUTES", "OLLAMA_UNDER"]
