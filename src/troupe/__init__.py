"""troupe: a supervisor for local LLM inference on Trio.

One OpenAI-compatible endpoint in front of many ``llama-server`` processes,
compatible with llama.cpp's router mode.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
