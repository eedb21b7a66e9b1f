"""Fake text generation and tokenization: predictable, paced, and able to crash."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import trio

from troupe_rig.fake_engine.config import FakeConfig
from troupe_rig.fake_engine.protocol import log
from troupe_rig.fake_engine.state import die

__all__ = ["WORDS", "count_prompt", "detokenize", "generate", "requested_tokens", "tokenize"]

# Generated text cycles through these pieces; ids sit after the tiny vocab's byte tokens.
WORDS: tuple[str, ...] = (" hello", " world", " the", " cat", " sat", " on", " a", " mat")
_WORD_BASE = 259
_BYTE_BASE = 3  # ids 3..258 are the byte tokens <0x00>..<0xFF>, as in the tiny GGUF vocab
BOS = 1


def tokenize(text: str, add_special: bool = False) -> list[int]:
    """One token per UTF-8 byte (the tiny vocab's byte fallback)."""
    return ([BOS] if add_special else []) + [_BYTE_BASE + b for b in text.encode()]


def detokenize(tokens: list[int]) -> str:
    out = bytearray()
    for t in tokens:
        if _BYTE_BASE <= t < _BYTE_BASE + 256:
            out.append(t - _BYTE_BASE)
        elif _WORD_BASE <= t < _WORD_BASE + len(WORDS):
            out += WORDS[t - _WORD_BASE].encode()
    return out.decode("utf-8", "replace")


def count_prompt(prompt: object) -> int:
    """Tokens a prompt would take: BOS plus one per byte, or the token list as given."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt) + 1
    if isinstance(prompt, list):
        return sum(count_prompt(p) for p in prompt)
    return len(str(prompt).encode()) + 1


def requested_tokens(body: Mapping[str, object], cfg: FakeConfig) -> int:
    """``n_predict`` / ``max_tokens`` / ``max_completion_tokens``, else the defaults."""
    for key in ("n_predict", "max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return min(value, cfg.n_ctx)
    return min(cfg.n_predict if cfg.n_predict >= 0 else cfg.tokens, cfg.n_ctx)


async def generate(cfg: FakeConfig, n_tokens: int) -> AsyncIterator[tuple[str, int]]:
    """Yield ``(text, token_id)`` pairs at ``--fake-tps``; die after ``--fake-crash-after``."""
    delay = 1.0 / cfg.tps if cfg.tps > 0 else 0.0
    if cfg.crash_after == 0:
        _crash(cfg)
    for i in range(n_tokens):
        if delay:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        k = i % len(WORDS)
        yield WORDS[k], _WORD_BASE + k
        if cfg.crash_after > 0 and i + 1 >= cfg.crash_after:
            await trio.lowlevel.checkpoint()  # let the caller's write of this token go out
            _crash(cfg)


def _crash(cfg: FakeConfig) -> None:
    # A realistic last word before dying, as a CUDA fault in llama.cpp prints it.
    log("CUDA error: an illegal memory access was encountered", "E")
    log("  current device: 0, in function ggml_backend_cuda_synchronize at "
        "ggml/src/ggml-cuda/ggml-cuda.cu:2796", "E")  # fmt: skip
    log(f"fake: crashing after {cfg.crash_after} tokens with exit code {cfg.crash_code}", "E")
    die(cfg.crash_code)
