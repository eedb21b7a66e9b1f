"""Session and response settings: what ``session.update`` and ``response.create`` may
change, checked field by field.

A field that is unknown, invalid or beyond what a local model can do is named in an
``error`` event; the valid fields of the same update still apply (clients send whole
configurations, and one field troupe cannot honour must not discard the rest).
"""

from __future__ import annotations

from typing import Any

import attrs

from troupe.realtime.events import RealtimeError

__all__ = ["AUDIO_FORMATS", "RESPONSE_KEYS", "ResponseConfig", "SessionConfig", "Updater"]

# audio/pcm is 16-bit little-endian mono at 24 kHz; pcmu/pcma are G.711 at 8 kHz.
AUDIO_FORMATS = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
_TOOL_CHOICES = ("auto", "none", "required")


@attrs.frozen
class ResponseConfig:
    """What one response runs with (the session's, or a response's overrides)."""

    instructions: str = ""
    output_modalities: tuple[str, ...] = ("text",)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None
    max_output_tokens: int | None = None  # None: "inf"
    parallel_tool_calls: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "tools": [dict(t) for t in self.tools],
            "tool_choice": self.tool_choice,
            "max_output_tokens": "inf"
            if self.max_output_tokens is None
            else self.max_output_tokens,
        }
        if self.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = self.parallel_tool_calls
        if self.temperature is not None:
            out["temperature"] = self.temperature  # the beta API's field; GA dropped it
        return out


@attrs.frozen
class SessionConfig:
    kind: str  # "realtime" or "transcription" (?intent=transcription)
    model: str
    response: ResponseConfig = ResponseConfig()
    input_format: str = "audio/pcm"
    transcription: dict[str, Any] | None = None  # {model, language, prompt}

    def to_json(self) -> dict[str, Any]:
        fmt: dict[str, Any] = {"type": self.input_format}
        if self.input_format == "audio/pcm":
            fmt["rate"] = 24000
        audio_in: dict[str, Any] = {
            "format": fmt,
            "transcription": self.transcription,
            "turn_detection": None,  # manual commit only
            "noise_reduction": None,
        }
        if self.kind == "transcription":
            return {"type": "transcription", "audio": {"input": audio_in}}
        return {
            "type": "realtime",
            "model": self.model,
            **self.response.to_json(),
            "audio": {"input": audio_in},
        }


class Updater:
    """Checks one update against what ``model`` can do; collects the faults by name."""

    def __init__(self, model: str, names: frozenset[str], output_modalities: tuple[str, ...]):
        self.model = model
        self.names = names  # the model's name and aliases
        self.outputs = output_modalities
        self.faults: list[str] = []

    def fault(self, path: str, why: str) -> None:
        self.faults.append(f"{path}: {why}")

    def error(self, what: str) -> RealtimeError | None:
        if not self.faults:
            return None
        return RealtimeError(
            f"{what}: " + "; ".join(self.faults),
            code="invalid_value",
            param=self.faults[0].split(":", 1)[0],
        )

    # ----- the whole update -------------------------------------------------------------

    def session(self, config: SessionConfig, data: object) -> SessionConfig:
        if not isinstance(data, dict):
            self.fault("session", "must be an object")
            return config
        changes: dict[str, Any] = {}
        kind = data.get("type", config.kind)
        if kind != config.kind:
            self.fault(
                "session.type", f"this session is a {config.kind} session (fixed at connect)"
            )
        for key, value in data.items():
            path = f"session.{key}"
            if key == "type":
                continue
            if key == "model":
                if value not in self.names:
                    self.fault(path, f"the session's model is {self.model} (fixed at connect)")
            elif key == "audio":
                changes.update(self._audio(value, config))
            elif key == "include":
                if value not in (None, []):
                    self.fault(path, "not supported")
            elif key in ("tracing", "prompt", "reasoning"):
                if value is not None:
                    self.fault(path, "not supported by troupe")
            elif key == "truncation":
                if value not in ("auto", "disabled"):
                    self.fault(path, "must be 'auto' or 'disabled'")
            elif config.kind == "realtime" and key in RESPONSE_KEYS:
                continue  # below, all together
            else:
                self.fault(path, "unknown field")
        if config.kind == "realtime":
            response = self.response(config.response, data, "session")
            changes["response"] = response
        return attrs.evolve(config, **changes)

    def response(self, base: ResponseConfig, data: dict[str, Any], where: str) -> ResponseConfig:
        changes: dict[str, Any] = {}
        for key in RESPONSE_KEYS & data.keys():
            value, path = data[key], f"{where}.{key}"
            checked = getattr(self, f"_{key}")(value, path)
            if checked is not _BAD:
                changes[key] = checked
        return attrs.evolve(base, **changes)

    # ----- single fields ----------------------------------------------------------------

    def _instructions(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            self.fault(path, "must be a string")
            return _BAD
        return value

    def _output_modalities(self, value: object, path: str) -> object:
        if (
            not isinstance(value, list)
            or not value
            or any(v not in ("text", "audio") for v in value)
        ):
            self.fault(path, "must be ['text'] or ['audio']")
            return _BAD
        if "audio" in value and "audio" not in self.outputs:
            outputs = ", ".join(self.outputs)
            self.fault(path, f"model {self.model} cannot produce audio (it outputs {outputs})")
            return _BAD
        return tuple(value)

    def _tools(self, value: object, path: str) -> object:
        if not isinstance(value, list):
            self.fault(path, "must be a list")
            return _BAD
        tools = []
        for i, tool in enumerate(value):
            where = f"{path}[{i}]"
            if not isinstance(tool, dict):
                self.fault(where, "must be an object")
                return _BAD
            if tool.get("type", "function") != "function":
                self.fault(f"{where}.type", "only function tools are supported")
                return _BAD
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                self.fault(f"{where}.name", "required (a non-empty string)")
                return _BAD
            unknown = set(tool) - {"type", "name", "description", "parameters"}
            if unknown:
                self.fault(where, f"unknown field {sorted(unknown)[0]!r}")
                return _BAD
            if "parameters" in tool and not isinstance(tool["parameters"], dict):
                self.fault(f"{where}.parameters", "must be a JSON schema object")
                return _BAD
            tools.append({"type": "function", **{k: v for k, v in tool.items() if k != "type"}})
        return tuple(tools)

    def _tool_choice(self, value: object, path: str) -> object:
        if value in _TOOL_CHOICES:
            return value
        if (
            isinstance(value, dict)
            and value.get("type") == "function"
            and isinstance(value.get("name"), str)
            and set(value) <= {"type", "name"}
        ):
            return dict(value)
        self.fault(path, "must be 'auto', 'none', 'required' or {type: 'function', name}")
        return _BAD

    def _temperature(self, value: object, path: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
            self.fault(path, "must be a number from 0 to 2")
            return _BAD
        return float(value)

    def _max_output_tokens(self, value: object, path: str) -> object:
        if value == "inf" or value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fault(path, "must be a positive integer or 'inf'")
            return _BAD
        return value

    def _parallel_tool_calls(self, value: object, path: str) -> object:
        if not isinstance(value, bool):
            self.fault(path, "must be true or false")
            return _BAD
        return value

    def _audio(self, value: object, config: SessionConfig) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fault("session.audio", "must be an object")
            return {}
        changes: dict[str, Any] = {}
        for key, part in value.items():
            if key == "output":
                if part:
                    self.fault("session.audio.output", "troupe's models answer in text only")
            elif key != "input":
                self.fault(f"session.audio.{key}", "unknown field")
            elif not isinstance(part, dict):
                self.fault("session.audio.input", "must be an object")
            else:
                changes.update(self._audio_input(part))
        return changes

    def _audio_input(self, part: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        for key, value in part.items():
            path = f"session.audio.input.{key}"
            if key == "format":
                fmt = value.get("type") if isinstance(value, dict) else None
                if fmt not in AUDIO_FORMATS:
                    self.fault(path, f"type must be one of {', '.join(AUDIO_FORMATS)}")
                elif fmt == "audio/pcm" and value.get("rate", 24000) != 24000:
                    self.fault(f"{path}.rate", "audio/pcm is 24000 Hz")
                else:
                    changes["input_format"] = fmt
            elif key == "transcription":
                checked = self._transcription(value, path)
                if checked is not _BAD:
                    changes["transcription"] = checked
            elif key in ("turn_detection", "noise_reduction"):
                if value is not None:
                    self.fault(path, "not supported (set it to null; commit audio by hand)")
            else:
                self.fault(path, "unknown field")
        return changes

    def _transcription(self, value: object, path: str) -> object:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fault(path, "must be an object or null")
            return _BAD
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in ("model", "language", "prompt"):
                if item is not None and not isinstance(item, str):
                    self.fault(f"{path}.{key}", "must be a string")
                    return _BAD
                if key != "model" or item in (None, *self.names):
                    out[key] = item
                else:
                    self.fault(f"{path}.model", f"transcription runs on {self.model}")
                    return _BAD
            else:
                self.fault(f"{path}.{key}", "unknown field")
                return _BAD
        out["model"] = self.model
        return out


_BAD = object()
# What a session sets for every response, and a response.create may override.
RESPONSE_KEYS = frozenset(
    {
        "instructions",
        "output_modalities",
        "tools",
        "tool_choice",
        "temperature",
        "max_output_tokens",
        "parallel_tool_calls",
    }
)
