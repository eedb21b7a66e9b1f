"""The Ollama API's pure parts: keep_alive durations, names over the catalog, request
bodies for the child and the child's answers in Ollama's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from troupe.catalog import Catalog, ModelEntry, Preset, Source
from troupe.ollama.answers import Answer
from troupe.ollama.keepalive import BadKeepAlive, parse_keep_alive
from troupe.ollama.names import listed_name, resolve
from troupe.ollama.requests import BadRequest, chat_request, embed_request, generate_request


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None), (0, 0.0), (300, 300.0), (2.5, 2.5), (-1, math.inf), ("-1", math.inf),
        ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0), ("300ms", 0.3),
        ("1.5h", 5400.0), ("-1m", math.inf), ("3600", 3600.0),
    ],
)  # fmt: skip
def test_keep_alive_reads_numbers_and_go_durations(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5x", "m5", "", "-", True, [1], "5m junk"])
def test_keep_alive_refuses_what_ollama_refuses(value: object) -> None:
    with pytest.raises(BadKeepAlive):
        parse_keep_alive(value)


def _entry(name: str, *, aliases: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> ModelEntry:
    return ModelEntry(
        name, Source.PRESET, Preset(name), aliases=frozenset(aliases), tags=frozenset(tags)
    )


CATALOG = Catalog(
    (
        _entry("gemma", aliases=("g3",), tags=("chat",)),
        _entry("org/repo:Q4_K_M"),
        _entry("org/two:Q4_K_M"),
        _entry("org/two:Q8_0"),
        _entry("llama:7b"),
    ),
    Path("/"),
)


@pytest.mark.parametrize(
    ("asked", "found"),
    [
        ("gemma", "gemma"), ("gemma:latest", "gemma"), ("g3", "gemma"), ("g3:latest", "gemma"),
        ("gemma:chat", "gemma"), ("gemma:code", None), ("org/repo:Q4_K_M", "org/repo:Q4_K_M"),
        ("org/repo", "org/repo:Q4_K_M"), ("org/repo:latest", "org/repo:Q4_K_M"),
        ("org/two", None), ("org/two:Q8_0", "org/two:Q8_0"), ("llama:7b", "llama:7b"),
        ("llama", None), ("nope", None), ("", None), ("GEMMA", "gemma"), ("Gemma:Latest", "gemma"),
        ("G3:CHAT", "gemma"), ("hf.co/org/repo:Q4_K_M", "org/repo:Q4_K_M"),
        ("hf.co/org/repo", "org/repo:Q4_K_M"), ("huggingface.co/org/two:Q8_0", "org/two:Q8_0"),
        ("ORG/REPO:q4_k_m", "org/repo:Q4_K_M"), ("hf.co/nope/nope", None),
    ],
)  # fmt: skip
def test_names_map_to_the_catalog(asked: str, found: str | None) -> None:
    entry = resolve(CATALOG, asked)
    assert (entry.name if entry else None) == found


def test_every_listed_name_resolves_back_to_its_entry() -> None:
    assert [listed_name(e) for e in CATALOG] == [
        "gemma:latest", "org/repo:Q4_K_M", "org/two:Q4_K_M", "org/two:Q8_0", "llama:7b",
    ]  # fmt: skip
    for entry in CATALOG:
        assert resolve(CATALOG, listed_name(entry)) == entry


def test_a_chat_becomes_the_childs_chat_completion() -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"
    req = {
        "messages": [
            {"role": "user", "content": "look", "images": [png]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "content": "42", "tool_name": "f"},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "format": {"type": "object"},
        "options": {"temperature": 0, "num_predict": 5, "top_k": 3, "num_ctx": 8192,
                    "stop": ["\n"], "num_keep": 4},
        "think": True,
    }  # fmt: skip
    child = chat_request("m", req, stream=True)
    assert child.target == "/v1/chat/completions"
    body = child.body
    assert body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "look"},
    ]
    call = body["messages"][1]["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert body["messages"][2] == {"role": "tool", "content": "42", "tool_call_id": call["id"],
                                   "name": "f"}  # fmt: skip
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0, 5, 3)
    assert (body["stop"], body["n_keep"]) == (["\n"], 4)
    schema = {"name": "format", "schema": {"type": "object"}}
    assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    assert body["reasoning_format"] == "deepseek"
    assert body["stream_options"] == {"include_usage": True}
    assert child.ignored == (("num_ctx", 8192),)  # a load-time option: warned about, not sent
    assert "num_ctx" not in body
    assert "n_ctx" not in body
    assert chat_request("m", {"messages": [], "format": "json"}, False).body["response_format"] == {
        "type": "json_object"
    }
    assert chat_request("m", {"messages": [], "think": False}, False).body[
        "chat_template_kwargs"
    ] == {"enable_thinking": False}


def test_generate_is_templated_raw_or_fill_in_the_middle() -> None:
    templated = generate_request("m", {"prompt": "hi", "system": "be brief"}, stream=False)
    assert templated.target == "/v1/chat/completions"
    assert templated.body["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
    ]  # fmt: skip
    raw = generate_request("m", {"prompt": "[INST]", "raw": True, "options": {"num_predict": 3}},
                           stream=True)  # fmt: skip
    assert (raw.target, raw.kind, raw.body["prompt"], raw.body["n_predict"]) == (
        "/completion", "completion", "[INST]", 3,
    )  # fmt: skip
    fim = generate_request("m", {"prompt": "def f(", "suffix": "return x"}, stream=False)
    assert fim.target == "/infill"
    assert (fim.body["input_prefix"], fim.body["input_suffix"]) == ("def f(", "return x")


@pytest.mark.parametrize(
    "req",
    [{"messages": "hi"}, {"messages": [{"content": "no role"}]}, {"messages": [], "format": 3},
     {"messages": [], "options": []}, {"messages": [{"role": "user", "images": [7]}]}],
)  # fmt: skip
def test_bad_chat_bodies_are_400s(req: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        chat_request("m", req, stream=False)


def test_embed_takes_a_string_or_a_list() -> None:
    assert embed_request("m", {"input": "a"}, "input") == (
        {"model": "m", "input": ["a"], "encoding_format": "float"}, 1,
    )  # fmt: skip
    assert embed_request("m", {"input": ["a", "b"]}, "input")[1] == 2
    with pytest.raises(BadRequest):
        embed_request("m", {"input": [1]}, "input")


def test_streamed_chat_chunks_become_ollamas_pieces_then_the_last_object() -> None:
    answer = Answer("m:latest", chat=True, kind="chat", started=0.0, load_s=0.5)
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": "He"}}]},
        {"choices": [{"delta": {"content": "llo", "reasoning_content": "hm"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c", "function":
            {"name": "f", "arguments": '{"x":'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}],
         "timings": {"prompt_n": 7, "prompt_ms": 2.0, "predicted_n": 5, "predicted_ms": 10.0}},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}},
    ]  # fmt: skip
    pieces = [p for c in chunks for p in answer.on_event(c)]
    assert [p["message"].get("content") for p in pieces] == ["He", "llo", ""]
    assert pieces[1]["message"]["thinking"] == "hm"
    assert pieces[2]["message"]["tool_calls"] == [
        {"function": {"name": "f", "arguments": {"x": 1}}}
    ]
    assert all(p["done"] is False and p["model"] == "m:latest" for p in pieces)
    last = answer.final(whole=False)
    assert last["done"] is True
    assert last["done_reason"] == "stop"
    assert (last["prompt_eval_count"], last["eval_count"]) == (7, 5)
    assert (last["prompt_eval_duration"], last["eval_duration"]) == (2_000_000, 10_000_000)
    assert last["load_duration"] == 500_000_000
    assert last["message"] == {"role": "assistant", "content": ""}


def test_a_whole_completion_is_one_object() -> None:
    answer = Answer("m", chat=False, kind="completion", started=0.0, load_s=0.0)
    answer.on_whole({"content": "Paris.", "stop_type": "limit", "tokens_evaluated": 4,
                     "tokens_predicted": 2})  # fmt: skip
    out = answer.final(whole=True)
    assert (out["response"], out["done_reason"]) == ("Paris.", "length")
    assert (out["prompt_eval_count"], out["eval_count"]) == (4, 2)
    json.dumps(out)
