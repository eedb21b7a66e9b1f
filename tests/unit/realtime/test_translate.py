"""The pure parts of the realtime translation: SSE splitting, chat messages, audio."""

from __future__ import annotations

import base64
import itertools
import struct

from hypothesis import given
from hypothesis import strategies as st

from troupe.realtime.audio import _alaw, _ulaw, duration_ms, to_wav
from troupe.realtime.config import ResponseConfig
from troupe.realtime.translate import SSEDecoder, chat_body, chat_messages

STREAM = (
    b'data: {"choices":[{"delta":{"content":"he"}}]}\n\n'
    b": a comment\n\n"
    b'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n'
    b"data: [DONE]\n\n"
    b'data: {"after": "done"}\n\n'
)


@given(st.lists(st.integers(0, len(STREAM)), max_size=8))
def test_sse_events_survive_any_chunking(cuts: list[int]) -> None:
    edges = sorted({0, len(STREAM), *cuts})
    decoder = SSEDecoder()
    got = []
    for a, b in itertools.pairwise(edges):
        got += list(decoder.feed(STREAM[a:b]))
    assert [e["choices"][0]["delta"]["content"] for e in got] == ["he", "llo"]
    assert decoder.done


def test_function_calls_join_the_assistant_turn_and_outputs_become_tool_messages() -> None:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "let me look"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ]  # fmt: skip
    messages = chat_messages(items, "Be brief.", "audio/pcm")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "let me look"
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert messages[4] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c3", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}],
    }  # fmt: skip


def test_audio_parts_go_as_wav_and_tools_as_chat_tools() -> None:
    audio = base64.b64encode(b"\x00\x01" * 2400).decode()
    parts = [{"type": "input_text", "text": "listen"}, {"type": "input_audio", "audio": audio}]
    items = [{"type": "message", "role": "user", "content": parts}]
    (message,) = chat_messages(items, "", "audio/pcm")
    part = message["content"][1]
    wav = base64.b64decode(part["input_audio"]["data"])
    assert part["input_audio"]["format"] == "wav"
    assert wav[:4] == b"RIFF"
    assert struct.unpack_from("<I", wav, 24)[0] == 24000
    config = ResponseConfig(
        tools=({"type": "function", "name": "f", "parameters": {"type": "object"}},),
        tool_choice={"type": "function", "name": "f"},
        max_output_tokens=9,
    )
    body = chat_body("m", [message], config)
    function = {"name": "f", "parameters": {"type": "object"}}
    assert body["tools"] == [{"type": "function", "function": function}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_tokens"] == 9
    assert "tools" not in chat_body("m", [], ResponseConfig(tools=config.tools, tool_choice="none"))


def test_g711_decoding_matches_the_standard_tables() -> None:
    # ITU-T G.711: mu-law 0xFF and A-law 0xD5 are the smallest positive steps.
    assert (_ulaw(0xFF), _ulaw(0x7F), _ulaw(0x00), _ulaw(0x80)) == (0, 0, -32124, 32124)
    assert (_alaw(0xD5), _alaw(0x55), _alaw(0xAA), _alaw(0x2A)) == (8, -8, 32256, -32256)
    wav = to_wav(b"\xff" * 8000, "audio/pcmu")
    assert struct.unpack_from("<I", wav, 40)[0] == 16000  # one second of 16-bit samples
    assert duration_ms(48000, "audio/pcm") == 1000
