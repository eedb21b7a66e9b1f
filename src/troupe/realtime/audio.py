"""Input audio: the Realtime formats turned into the WAV files llama-server takes.

The Realtime API sends raw samples (16-bit PCM at 24 kHz, or G.711 mu-law/A-law at
8 kHz); llama-server's chat ``input_audio`` parts and ``/v1/audio/transcriptions``
take a WAV or MP3 file. G.711 is decoded here (the ``audioop`` module is deprecated).
"""

from __future__ import annotations

import secrets
import struct

from troupe.realtime.config import AUDIO_FORMATS

__all__ = ["duration_ms", "multipart_body", "to_wav"]


def _ulaw(byte: int) -> int:
    byte = ~byte & 0xFF
    exponent, mantissa = (byte >> 4) & 0x07, byte & 0x0F
    magnitude = ((mantissa << 3) + 0x84) << exponent
    return (0x84 - magnitude) if byte & 0x80 else (magnitude - 0x84)


def _alaw(byte: int) -> int:
    byte ^= 0x55
    exponent, mantissa = (byte >> 4) & 0x07, byte & 0x0F
    magnitude = (
        (mantissa << 4) + 8 if exponent == 0 else ((mantissa << 4) + 0x108) << (exponent - 1)
    )
    return magnitude if byte & 0x80 else -magnitude


# One 16-bit sample (little-endian bytes) per G.711 byte value.
_G711 = {
    "audio/pcmu": [struct.pack("<h", _ulaw(b)) for b in range(256)],
    "audio/pcma": [struct.pack("<h", _alaw(b)) for b in range(256)],
}


def _pcm16(data: bytes, fmt: str) -> bytes:
    table = _G711.get(fmt)
    return data if table is None else b"".join(table[b] for b in data)


def duration_ms(size: int, fmt: str) -> float:
    bytes_per_sample = 2 if fmt == "audio/pcm" else 1
    return size / bytes_per_sample / AUDIO_FORMATS[fmt] * 1000


def to_wav(data: bytes, fmt: str) -> bytes:
    """A mono 16-bit WAV file of ``data`` in the Realtime format ``fmt``."""
    samples = _pcm16(data[: len(data) & ~1] if fmt == "audio/pcm" else data, fmt)
    rate = AUDIO_FORMATS[fmt]
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(samples),
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        1,  # mono
        rate,
        rate * 2,
        2,
        16,
        b"data",
        len(samples),
    )
    return header + samples


def multipart_body(fields: dict[str, str], file: bytes) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body with ``fields`` and ``file`` (audio.wav)."""
    boundary = f"----troupe-realtime-{secrets.token_hex(8)}"
    out = bytearray()
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        out += value.encode() + b"\r\n"
    out += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="audio.wav"'
        "\r\nContent-Type: audio/wav\r\n\r\n"
    ).encode()
    out += file + f"\r\n--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"
