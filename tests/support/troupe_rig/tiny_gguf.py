"""Tiny, real, loadable GGUF models that the test suite writes itself.

A `TinyModel` is a 4-layer llama of about 1.3 MB (F16 matrices, F32 norms) with
an SPM vocabulary of 294 tokens: ``<unk>``, ``<s>``, ``</s>``, the 256 byte
tokens and a few word pieces. The real ``llama-server`` loads it in well under a
second and generates from it, so end-to-end tests need no download.

The weights are random but shaped on purpose: every token embedding shares one
large common direction, and the output matrix scores the word pieces high along
that direction and the special tokens low. Whatever the prompt, generation then
emits readable pieces (" hello", " world", ...) and practically never ``</s>``,
so a request for N tokens predicts N tokens and the text is valid UTF-8.

``run_char`` adds tokens for runs of one character (``x``, ``xx``, ``xxxx``, ... up to
``run_max`` of them): SPM merges two neighbours whose concatenation is a token, so
200 KB of that character is a few hundred tokens, and a long prompt stays cheap.

Files are deterministic: the same spec gives byte-identical files; a different
seed or name gives different weights (the name is mixed into the RNG seed) and a
different ``general.name``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import gguf
import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "TinyModel",
    "tiny_vocab",
    "write_tiny_gguf",
    "write_tiny_models",
]

# ChatML: both llama.cpp's jinja engine and its legacy template detector know it.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# SPM pieces; "\u2581" is sentencepiece's word-start marker. The prefixes of
# " hello" and " world" are present so the tokenizer can actually merge them.
_PIECES: tuple[str, ...] = (
    "\u2581", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l",
    "\u2581t", "\u2581a", "he", "\u2581the", "\u2581h", "\u2581he", "\u2581hel",
    "\u2581hell", "\u2581hello", "\u2581w", "\u2581wo", "\u2581wor", "\u2581worl",
    "\u2581world", "\u2581is", "\u2581of", "\u2581and", "\u2581to", "\u2581in",
    "\u2581it", "\u2581on", "\u2581cat", "\u2581sat",
)  # fmt: skip

ExtraValue = bool | int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]

_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_BYTE = 1, 2, 3, 6


def _freeze_extra(
    value: Mapping[str, object] | Iterable[tuple[str, object]],
) -> tuple[tuple[str, ExtraValue], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    frozen: list[tuple[str, ExtraValue]] = []
    for key, raw in items:
        val = tuple(raw) if isinstance(raw, list | tuple) else raw
        if not isinstance(val, bool | int | float | str | tuple):
            raise TypeError(f"unsupported GGUF metadata value for {key!r}: {val!r}")
        frozen.append((str(key), val))
    return tuple(sorted(frozen))


@attrs.frozen
class TinyModel:
    """The recipe of one tiny llama GGUF.

    ``extra`` adds or overrides metadata keys, e.g.
    ``{"llama.attention.sliding_window": 128}`` (ints are written as uint32,
    negative ints as int32, floats as float32, tuples as arrays).
    ``chat_template=None`` writes no template at all.
    """

    name: str
    seed: int = 0
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256
    n_ctx: int = 512
    run_char: str = ""  # a character whose runs have tokens of their own (module doc)
    run_max: int = 1024
    chat_template: str | None = DEFAULT_CHAT_TEMPLATE
    extra: tuple[tuple[str, ExtraValue], ...] = attrs.field(default=(), converter=_freeze_extra)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_vocab(self) -> int:
        return len(tiny_vocab(self.run_char, self.run_max)[0])

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def _runs(run_char: str, run_max: int) -> list[str]:
    """``c``, ``cc``, ``cccc``, ... (powers of two up to ``run_max``), none already a piece."""
    out: list[str] = []
    length = 1
    while run_char and length <= run_max:
        if run_char * length not in _PIECES:
            out.append(run_char * length)
        length *= 2
    return out


def tiny_vocab(run_char: str = "", run_max: int = 1024) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the tiny SPM vocabulary (294 tokens, and the
    runs of ``run_char`` after them)."""
    pieces = [*_PIECES, *_runs(run_char, run_max)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    # Longer pieces score higher so the SPM merger prefers them.
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [float(len(p)) - 10.0 for p in pieces]
    types = [_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_CONTROL]
    types += [_TOKEN_BYTE] * 256 + [_TOKEN_NORMAL] * len(pieces)
    return tokens, scores, types


def _rng(spec: TinyModel) -> np.random.Generator:
    digest = hashlib.sha256(spec.name.encode()).digest()
    return np.random.default_rng([spec.seed, int.from_bytes(digest[:8], "little")])


def _tensors(spec: TinyModel) -> list[tuple[str, npt.NDArray[np.generic]]]:
    """Weights in llama.cpp's names, numpy shapes (ggml order reversed)."""
    rng = _rng(spec)
    n_vocab, n_embd, n_ff = spec.n_vocab, spec.n_embd, spec.n_ff
    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim

    def mat(rows: int, cols: int, std: float = 0.02) -> npt.NDArray[np.float16]:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float16)

    def norm() -> npt.NDArray[np.float32]:
        return np.ones(n_embd, dtype=np.float32)

    # The common direction keeps the residual stream pointing one way whatever the
    # input, so the output matrix decides which tokens are likely (see module doc).
    common = rng.standard_normal(n_embd)
    common /= np.linalg.norm(common)
    embd = common * 4.0 + rng.standard_normal((n_vocab, n_embd)) * 0.02
    out = rng.standard_normal((n_vocab, n_embd)) * 0.02
    n_special = 3
    n_bytes = 256
    out[:n_special] -= common * 0.8
    # The word pieces are what it says; the runs (after them) are only read.
    out[n_special + n_bytes : n_special + n_bytes + len(_PIECES)] += common * 0.8

    tensors: list[tuple[str, npt.NDArray[np.generic]]] = [
        ("token_embd.weight", embd.astype(np.float16)),
    ]
    for i in range(spec.n_layer):
        tensors += [
            (f"blk.{i}.attn_norm.weight", norm()),
            (f"blk.{i}.attn_q.weight", mat(q_dim, n_embd)),
            (f"blk.{i}.attn_k.weight", mat(kv_dim, n_embd)),
            (f"blk.{i}.attn_v.weight", mat(kv_dim, n_embd)),
            (f"blk.{i}.attn_output.weight", mat(n_embd, q_dim)),
            (f"blk.{i}.ffn_norm.weight", norm()),
            (f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd)),
            (f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd)),
            (f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff)),
        ]
    tensors += [("output_norm.weight", norm()), ("output.weight", out.astype(np.float16))]
    return tensors


def _metadata(spec: TinyModel) -> dict[str, ExtraValue]:
    """Every metadata key of the file; ``spec.extra`` overrides the standard ones."""
    tokens, scores, types = tiny_vocab(spec.run_char, spec.run_max)
    meta: dict[str, ExtraValue] = {
        "general.name": spec.name,
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_F16),
        "llama.context_length": spec.n_ctx,
        "llama.embedding_length": spec.n_embd,
        "llama.block_count": spec.n_layer,
        "llama.feed_forward_length": spec.n_ff,
        "llama.attention.head_count": spec.n_head,
        "llama.attention.head_count_kv": spec.n_head_kv,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": spec.head_dim,  # llama requires n_rot == head_dim
        "llama.rope.freq_base": 10000.0,
        "llama.vocab_size": len(tokens),
        "tokenizer.ggml.model": "llama",  # SPM
        "tokenizer.ggml.tokens": tuple(tokens),
        "tokenizer.ggml.scores": tuple(scores),
        "tokenizer.ggml.token_type": tuple(types),
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    if spec.chat_template is not None:
        meta["tokenizer.chat_template"] = spec.chat_template
    meta.update(spec.extra)
    return meta


def _add_value(writer: gguf.GGUFWriter, key: str, value: ExtraValue) -> None:
    if key == "general.architecture":
        return  # GGUFWriter writes it from its constructor argument
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if value < 0:
            writer.add_int32(key, value)
        else:
            writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))  # element type follows the first element


def write_tiny_gguf(path: str | os.PathLike[str], spec: TinyModel) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` (atomically) and return the path.

    ``path`` may be an existing directory; the file is then ``<name>.gguf`` in it.
    """
    target = Path(path)
    if target.is_dir():
        target = target / spec.filename
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    try:
        for key, value in _metadata(spec).items():
            _add_value(writer, key, value)
        for name, array in _tensors(spec):
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    try:
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_tiny_models(
    directory: str | os.PathLike[str],
    models: int | Sequence[str] | Sequence[TinyModel] = 3,
    *,
    prefix: str = "tiny",
) -> list[Path]:
    """Write several distinct tiny models as ``<directory>/<name>.gguf``.

    ``models`` is a count (names ``tiny-a``, ``tiny-b``, ...), a list of names
    (seed = position) or a list of full specs.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specs: list[TinyModel] = []
    if isinstance(models, int):
        specs = [TinyModel(name=f"{prefix}-{_letters(i)}", seed=i) for i in range(models)]
    else:
        for i, item in enumerate(models):
            specs.append(item if isinstance(item, TinyModel) else TinyModel(name=str(item), seed=i))
    return [write_tiny_gguf(directory / spec.filename, spec) for spec in specs]


def _letters(i: int) -> str:
    """0 -> a, 25 -> z, 26 -> aa: short distinct names for any count."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(ord("a") + r) + out
    return out
