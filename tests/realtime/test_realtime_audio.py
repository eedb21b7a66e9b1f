"""Input audio over /v1/realtime: the buffer, commits, transcription by the child.

No audio-capable model ships for the tests, so the child is the fake engine with
``fake-audio``: it reports the audio modality once loaded (as llama-server does for a
model with an audio projector), and its transcriptions say the length and rate of
the WAV troupe made of the Realtime audio, which is what troupe is responsible for.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
import trio_websocket

from troupe.realtime import handshake
from troupe.realtime.session import Limits
from troupe.sched import Status
from troupe_rig.realtime_client import raw_socket, validate
from troupe_rig.router import RouterFactory, RunningRouter


async def loaded(router: RunningRouter, model: str) -> None:
    await router.ctx.scheduler.load(model)
    await router.wait_for_status(model, Status.LOADED)


class Socket:
    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps(event))

    async def next(self) -> Any:
        with trio.fail_after(10):
            return validate(await self.ws.get_message())


def pcm(ms: int, rate: int = 24000, sample: bytes = b"\x01\x00") -> str:
    """``ms`` of base64 audio: 16-bit PCM, or one byte per sample (G.711)."""
    return base64.b64encode(sample * (rate * ms // 1000)).decode()


async def test_commit_transcribe_and_answer_from_audio(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-audio": "1"}}) as router:
        await loaded(router, "a")
        async with raw_socket(router.url, "/v1/realtime?model=a") as ws:
            s = Socket(ws)
            await s.next()
            session = {
                "type": "realtime",
                "audio": {"input": {"transcription": {"language": "en"}}},
            }
            await s.send({"type": "session.update", "session": session})
            assert (await s.next()).session.audio.input.transcription.model == "a"
            await s.send({"type": "input_audio_buffer.commit"})
            assert (await s.next()).error.code == "input_audio_buffer_commit_empty"
            for _ in range(2):
                await s.send({"type": "input_audio_buffer.append", "audio": pcm(100)})
            await s.send({"type": "input_audio_buffer.commit"})
            committed, added, done = await s.next(), await s.next(), await s.next()
            assert committed.type == "input_audio_buffer.committed"
            assert added.item.id == committed.item_id
            assert added.item.content[0].audio is None  # audio bytes only on retrieve
            assert done.type == "conversation.item.done"
            transcribed = await s.next()
            assert transcribed.type == "conversation.item.input_audio_transcription.completed"
            assert transcribed.transcript == "heard 200 ms at 24000 Hz"
            await s.send({"type": "conversation.item.retrieve", "item_id": committed.item_id})
            item = (await s.next()).item
            assert len(base64.b64decode(item.content[0].audio)) == 2 * 4800
            assert item.content[0].transcript == "heard 200 ms at 24000 Hz"
            await s.send({"type": "input_audio_buffer.append", "audio": pcm(50)})
            await s.send({"type": "input_audio_buffer.clear"})
            assert (await s.next()).type == "input_audio_buffer.cleared"
            await s.send({"type": "response.create", "response": {"max_output_tokens": 3}})
            kinds = []
            while not kinds or kinds[-1] != "response.done":
                kinds.append((await s.next()).type)
            assert "response.output_text.delta" in kinds


async def test_transcription_session_with_g711(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-audio": "1"}}) as router:
        await loaded(router, "a")
        async with raw_socket(router.url, "/v1/realtime?model=a&intent=transcription") as ws:
            s = Socket(ws)
            created = await s.next()
            assert created.session.type == "transcription"
            fmt = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}
            await s.send({"type": "session.update", "session": fmt})
            assert (await s.next()).session.audio.input.format.type == "audio/pcmu"
            await s.send({"type": "input_audio_buffer.append", "audio": pcm(1000, 8000, b"\xff")})
            await s.send({"type": "input_audio_buffer.commit"})
            kinds = [(await s.next()).type for _ in range(3)]
            assert kinds == ["input_audio_buffer.committed", "conversation.item.added",
                             "conversation.item.done"]  # fmt: skip
            transcribed = await s.next()
            assert transcribed.transcript == "heard 1000 ms at 8000 Hz"  # decoded to 16-bit
            await s.send({"type": "response.create"})
            assert (await s.next()).error.code == "invalid_session_type"


async def test_the_audio_buffer_has_a_limit(
    fake_router: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handshake, "LIMITS", Limits(max_audio_bytes=10_000))
    async with fake_router({"a": {"fake-audio": "1"}}) as router:
        await loaded(router, "a")
        async with raw_socket(router.url, "/v1/realtime?model=a") as ws:
            s = Socket(ws)
            await s.next()
            await s.send({"type": "input_audio_buffer.append", "audio": pcm(300)})
            assert (await s.next()).error.code == "input_audio_buffer_full"
            await s.send({"type": "input_audio_buffer.append", "audio": "not base64!"})
            assert (await s.next()).error.param == "audio"
