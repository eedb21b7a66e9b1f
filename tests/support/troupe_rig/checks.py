"""Behaviour checks that hold for the real ``llama-server`` and for the fake alike.

The suite runs each check against both engines: that is what shows the fake
mirrors the real one (ARCHITECTURE.md, principle 8). Every check takes the engine's
command line and runs its own process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import psutil
import trio

from troupe.child.breakdown import last_breakdown
from troupe_rig.engine_process import EngineProcess, open_engine

__all__ = [
    "check_child_exit_command",
    "check_child_ready",
    "check_child_stdin_eof",
    "check_http_surface",
    "loaded_breakdown",
    "read_sse",
    "wait_serving",
]

META_KEYS = {"vocab_type", "n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size", "ftype"}
INFO_KEYS = ["id", "aliases", "tags", "object", "architecture", "created", "owned_by", "meta"]
TIMEOUT = 30.0


async def read_sse(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order."""
    events: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
    return events


async def wait_serving(engine: EngineProcess) -> None:
    """Return once the engine's main loop runs, so an exit command is not lost.

    llama-server sends ``ready`` just before entering its task loop, and the loop
    start resets the stop flag: an exit command landing in between is ignored
    (server_queue::start_loop sets ``running = true``). A ``/slots`` answer comes
    from that loop.
    """
    async with httpx.AsyncClient(base_url=await engine.url(), timeout=TIMEOUT) as client:
        r = await client.get("/slots")
        assert r.status_code == 200, r.text


async def loaded_breakdown(argv: Sequence[str]) -> tuple[dict[str, int], int]:
    """What the child itself says it holds once loaded (the breakdown it prints at exit,
    with ``-lv 4``), and its RSS once up."""
    async with open_engine([*argv, "-lv", "4"], child=True) as engine:
        with trio.fail_after(TIMEOUT):
            await engine.wait_state("ready")
            await wait_serving(engine)  # else the exit command can be lost
            rss = psutil.Process(engine.process.pid).memory_info().rss
            await engine.send_exit()
            await engine.wait()
    return last_breakdown(engine.stderr_lines), rss


def _check_ready_payload(payload: object, name: str) -> None:
    assert isinstance(payload, dict), payload
    assert list(payload) == INFO_KEYS, f"ready payload keys: {list(payload)}"
    assert payload["id"] == name, payload
    assert (payload["object"], payload["owned_by"]) == ("model", "llamacpp"), payload
    assert set(payload["meta"]) == META_KEYS, payload["meta"]


async def check_child_ready(argv: Sequence[str], name: str) -> EngineProcess:
    """Loading lines (0.0 first, 1.0 last), then ready with the model info; nothing else on stdout.

    Leaves the engine running; returns it after the exit command stopped it with code 0.
    """
    async with open_engine(argv) as engine:
        with trio.fail_after(TIMEOUT):
            payload = await engine.wait_state("ready")
        _check_ready_payload(payload, name)
        kinds = [s for s, _ in engine.states]
        assert (kinds[-1], set(kinds[:-1])) == ("ready", {"loading"}), kinds
        progress = [p for s, p in engine.states if s == "loading"]
        assert progress[0] == {"stages": ["text_model"], "current": "text_model", "value": 0.0}
        assert progress[-1] == {"stages": ["text_model"], "current": "text_model", "value": 1.0}
        assert engine.stdout_lines == [], engine.stdout_lines
        with trio.fail_after(TIMEOUT):
            await wait_serving(engine)
            await engine.send_exit()
            code = await engine.wait()
        assert code == 0, engine.stderr_text
        return engine


async def check_child_exit_command(argv: Sequence[str]) -> None:
    """``cmd_router_to_child:exit`` on stdin: graceful shutdown, exit code 0."""
    async with open_engine(argv) as engine:
        with trio.fail_after(TIMEOUT):
            await engine.wait_state("ready")
            await wait_serving(engine)
            await engine.send_exit()
            assert await engine.wait() == 0, engine.stderr_text
        assert "exit command received, exiting..." in engine.stderr_text


async def check_child_stdin_eof(argv: Sequence[str]) -> None:
    """Stdin EOF (the router died): the child exits 1 at once.

    Its "EOF on stdin detected, forcing shutdown..." line is not checked: llama-server
    logs from a worker thread, and the exit(1) that follows can drop what it had not
    written yet (seen on a loaded machine: stderr ended right after start-up)."""
    async with open_engine(argv) as engine:
        with trio.fail_after(TIMEOUT):
            await engine.wait_state("ready")
            await engine.close_stdin()
            assert await engine.wait() == 1, engine.stderr_text


async def check_http_surface(client: httpx.AsyncClient, name: str) -> None:
    """Health, models, completion, tokenize, 404, streamed chat: shapes both engines share.

    The streamed request comes last: do not reuse ``client``'s connections afterwards.
    """
    r = await client.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"}), r.text
    models = (await client.get("/v1/models")).json()
    assert (models["object"], models["data"][0]["id"]) == ("list", name), models
    _check_ready_payload(models["data"][0], name)

    r = await client.post("/completion", json={"prompt": "hello world", "n_predict": 8})
    body = r.json()
    assert r.status_code == 200, r.text
    assert (body["tokens_predicted"], body["stop"]) == (8, True), body
    assert str(body["content"]).strip(), body

    tokens = (await client.post("/tokenize", json={"content": "hello world"})).json()["tokens"]
    assert tokens, tokens
    assert all(isinstance(t, int) for t in tokens), tokens
    text = (await client.post("/detokenize", json={"tokens": tokens})).json()["content"]
    assert text.strip() == "hello world", text

    r = await client.get("/no-such-route")
    expected = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
    assert (r.status_code, r.json()) == (404, expected), r.text

    # Last: after an SSE stream llama-server closes the connection although it answered
    # "Keep-Alive", so a pooled connection reused after it may fail (RemoteProtocolError).
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = await read_sse(response)
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks), chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}, chunks[0]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content.strip(), chunks
    # role, one per token (a token ending inside a UTF-8 sequence may merge), finish
    assert 3 <= len(chunks) <= 4 + 2, chunks
