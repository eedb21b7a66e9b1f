"""GGUF files written with the real `gguf.GGUFWriter` for the gguf tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

Build = Callable[[gguf.GGUFWriter], None]

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if tools %}<|tools|>{{ tools | tojson }}{% endif %}"
)


def write_gguf(
    path: Path,
    arch: str,
    build: Build,
    *,
    endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
    split_max_tensors: int = 0,
) -> Path:
    w = gguf.GGUFWriter(path, arch, endianess=endianess, split_max_tensors=split_max_tensors)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_spm_vocab(w: gguf.GGUFWriter, n_pieces: int = 35) -> int:
    """An SPM vocabulary: <unk> <s> </s>, 256 byte tokens, pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581p{i}" for i in range(n_pieces)]
    types = [2, 3, 3] + [6] * 256 + [1] * n_pieces
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    return len(tokens)


def llama_like(
    *,
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 4,
    n_head_kv: int | list[int] = 2,
    n_ff: int = 256,
    ctx: int = 512,
    tensors: bool = True,
    extra: Build | None = None,
) -> Build:
    """A tiny loadable llama (F16 matrices, F32 norms)."""

    def build(w: gguf.GGUFWriter) -> None:
        w.add_name("tiny-llama")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_context_length(ctx)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(n_embd // n_head)
        w.add_rope_freq_base(10000.0)
        n_vocab = add_spm_vocab(w)
        w.add_add_bos_token(True)
        w.add_chat_template(TINY_CHAT_TEMPLATE)
        if extra is not None:
            extra(w)
        if not tensors:
            return
        hd = n_embd // n_head
        kv = max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv
        f16, f32 = np.float16, np.float32
        w.add_tensor("token_embd.weight", np.zeros((n_vocab, n_embd), f16))
        w.add_tensor("output_norm.weight", np.ones((n_embd,), f32))
        for i in range(n_layer):
            b = f"blk.{i}."
            w.add_tensor(b + "attn_norm.weight", np.ones((n_embd,), f32))
            w.add_tensor(b + "attn_q.weight", np.zeros((n_head * hd, n_embd), f16))
            w.add_tensor(b + "attn_k.weight", np.zeros((kv * hd, n_embd), f16))
            w.add_tensor(b + "attn_v.weight", np.zeros((kv * hd, n_embd), f16))
            w.add_tensor(b + "attn_output.weight", np.zeros((n_embd, n_head * hd), f16))
            w.add_tensor(b + "ffn_norm.weight", np.ones((n_embd,), f32))
            w.add_tensor(b + "ffn_gate.weight", np.zeros((n_ff, n_embd), f16))
            w.add_tensor(b + "ffn_up.weight", np.zeros((n_ff, n_embd), f16))
            w.add_tensor(b + "ffn_down.weight", np.zeros((n_embd, n_ff), f16))

    return build


def clip_mmproj(vision: bool | None, audio: bool | None) -> Build:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_name("mmproj")
        w.add_type("mmproj")
        w.add_clip_projector_type("gemma3")
        if vision is not None:
            w.add_clip_has_vision_encoder(vision)
        if audio is not None:
            w.add_clip_has_audio_encoder(audio)
        w.add_tensor("mm.input_projection.weight", np.zeros((8, 16), np.float16))

    return build


class GgufFiles:
    """Writes GGUF files under one temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, name: str, arch: str, build: Build, **kw: object) -> Path:
        return write_gguf(self.root / name, arch, build, **kw)  # type: ignore[arg-type]

    def llama(self, name: str = "tiny-llama.gguf", **kw: object) -> Path:
        return self.write(name, "llama", llama_like(**kw))  # type: ignore[arg-type]

    def mmproj(self, vision: bool | None, audio: bool | None, name: str = "mmproj.gguf") -> Path:
        return self.write(name, "clip", clip_mmproj(vision, audio))


@pytest.fixture
def files(tmp_path: Path) -> GgufFiles:
    return GgufFiles(tmp_path)


@pytest.fixture(scope="session")
def big_vocab_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """151,936 tokens and 150,000 merges, like a Qwen tokenizer."""
    n_tokens, n_merges = 151_936, 150_000

    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(32768)
        w.add_embedding_length(64)
        w.add_block_count(2)
        w.add_head_count(4)
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(n_tokens)])
        w.add_token_merges([f"m{i} n{i}" for i in range(n_merges)])
        w.add_token_types([1] * n_tokens)
        w.add_tensor("token_embd.weight", np.zeros((4, 64), np.float16))

    return write_gguf(tmp_path_factory.mktemp("big") / "big-vocab.gguf", "qwen2", build)
