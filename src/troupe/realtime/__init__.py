"""The OpenAI Realtime API (``/v1/realtime``), served by troupe over any model it serves.

llama-server has no WebSocket endpoint; a realtime session lives in troupe, keeps the
conversation, and for each response leases the model and streams the child's
``/v1/chat/completions`` back as Realtime events (ARCHITECTURE.md, actors).
"""

from troupe.realtime.handshake import REALTIME_PATHS, WebSocketRequest, serve_realtime

__all__ = ["REALTIME_PATHS", "WebSocketRequest", "serve_realtime"]
