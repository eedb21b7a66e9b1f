"""The facts troupe derives from a model's GGUF header.

Decisions worth knowing:

* ``parameter_count`` is the sum of the tensors' elements over all shards, as
  llama.cpp counts ``n_params`` (``/models`` ``meta``), MTP layers included.
  GGUF has no standard parameter-count key (``general.size_label`` such as
  ``"7B"`` is only a label, kept as `size_label`). When shards of a split model
  are missing the count is None rather than a silent undercount.
* ``tensor_bytes`` and ``tensor_bytes_by_type`` cover the shards that were read
  (`shards_read` of `split_count`).
* Keys with an unexpected type read as absent; only a missing
  ``general.architecture`` is an error.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence

import attrs

from troupe.gguf import capabilities as caps
from troupe.gguf._source import GGUFError
from troupe.gguf.arch import kv_layers_from_start, swa_pattern
from troupe.gguf.constants import LlamaFileType
from troupe.gguf.header import read_header
from troupe.gguf.records import GGUFHeader

__all__ = ["ModelFacts", "model_facts", "read_model_facts", "shard_paths"]

IntOrPerLayer = int | tuple[int, ...]
_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


@attrs.frozen
class ModelFacts:
    """What troupe knows about a model file without loading it.

    `None` means the key is absent (or has an unexpected type). Per-layer values
    (`head_count`, `head_count_kv`) are an int or a tuple with one entry per block.
    """

    architecture: str
    name: str | None
    kind: str | None  # general.type: "model", "mmproj", "adapter", ...
    size_label: str | None
    context_length: int | None
    embedding_length: int | None
    feed_forward_length: int | None  # the largest, when it is given per layer
    block_count: int | None
    head_count: IntOrPerLayer | None
    head_count_kv: IntOrPerLayer | None  # defaults to head_count, as llama.cpp
    key_length: int | None
    value_length: int | None
    key_length_swa: int | None
    value_length_swa: int | None
    is_mla: bool  # key_length_mla and value_length_mla set: the KV cache has no V
    sliding_window: int | None  # the key as written
    swa_window: int  # effective window, 0 when SWA is off
    swa_layers: tuple[bool, ...] | None  # effective per-layer flags, None when SWA is off
    kv_layers_from_start: int | None  # layers from here on reuse earlier KV (gemma3n/4)
    file_type: int | None
    file_type_name: str | None  # "Q4_K_M", "F16", ...
    parameter_count: int | None
    tensor_bytes: int
    tensor_bytes_by_type: Mapping[str, int]
    has_chat_template: bool
    chat_template_mentions_tools: bool
    vocab_size: int | None
    pooling_type: int | None
    mtp_layers: int
    split_count: int
    split_no: int
    shards_read: int
    decision_type: str | None
    is_embedding: bool
    output_modalities: tuple[str, ...]

    @property
    def rejection(self) -> str | None:
        """Why this file cannot be loaded as a main model, or None."""
        return caps.main_model_rejection(self.architecture)

    @property
    def n_layer(self) -> int:
        """Trunk layers: ``block_count`` minus MTP layers (llama_hparams::n_layer)."""
        return max(0, (self.block_count or 0) - self.mtp_layers)

    def per_layer(self, value: IntOrPerLayer | None) -> tuple[int, ...]:
        """`value` (scalar or per-layer) spread over ``block_count`` layers."""
        n = self.block_count or 0
        if isinstance(value, tuple):
            return value[:n] + (0,) * (n - len(value))
        return (value or 0,) * n


def _int_or_array(h: GGUFHeader, key: str) -> IntOrPerLayer | None:
    v = h.get(key)
    if isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(int(x) for x in v)
    return h.get_int(key)


def _mtp_layers(h: GGUFHeader, arch: str) -> int:
    v = h.get(f"{arch}.nextn_predict_layers")
    if v is None:
        v = next((f.value for k, f in h.fields.items() if k.endswith(".nextn_predict_layers")), 0)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return 0
    return max(0, math.floor(v))


def _file_type_name(ft: int | None) -> str | None:
    if ft is None:
        return None
    try:
        name = LlamaFileType(ft).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def model_facts(header: GGUFHeader, shards: Sequence[GGUFHeader] = ()) -> ModelFacts:
    """Facts from a model's (first-shard) header; `shards` are the other shards' headers."""
    h = header
    arch = h.get_str("general.architecture")
    if not arch:
        raise GGUFError(f"{h.path}: no general.architecture")
    a = f"{arch}.attention"
    block_count = h.get_int(f"{arch}.block_count")
    mtp = _mtp_layers(h, arch)
    head_count = _int_or_array(h, f"{a}.head_count")
    head_count_kv = _int_or_array(h, f"{a}.head_count_kv")
    window = h.get_int(f"{a}.sliding_window")
    pattern = h.get(f"{a}.sliding_window_pattern")
    swa = swa_pattern(arch, max(0, (block_count or 0) - mtp), window, pattern)
    shared = h.get_int(f"{a}.shared_kv_layers")
    template = h.get_str("tokenizer.chat_template") or ""
    pooling = h.get_int(f"{arch}.pooling_type")
    vocab = h.get_int(f"{arch}.vocab_size")
    split_count = max(1, h.get_int("split.count") or 1)
    headers = [h, *shards]
    by_type: dict[str, int] = {}
    for s in headers:
        for t, n in s.bytes_by_type().items():
            by_type[t] = by_type.get(t, 0) + n
    complete = len(headers) >= split_count
    decision = h.get_str(f"{arch}.decision.type")
    file_type = h.get_int("general.file_type")
    return ModelFacts(
        architecture=arch,
        name=h.get_str("general.name"),
        kind=h.get_str("general.type"),
        size_label=h.get_str("general.size_label"),
        context_length=h.get_int(f"{arch}.context_length"),
        embedding_length=h.get_int(f"{arch}.embedding_length"),
        feed_forward_length=_largest(h.get(f"{arch}.feed_forward_length")),
        block_count=block_count,
        head_count=head_count,
        head_count_kv=head_count if head_count_kv is None else head_count_kv,
        key_length=h.get_int(f"{a}.key_length"),
        value_length=h.get_int(f"{a}.value_length"),
        key_length_swa=h.get_int(f"{a}.key_length_swa"),
        value_length_swa=h.get_int(f"{a}.value_length_swa"),
        is_mla=bool(h.get_int(f"{a}.key_length_mla") and h.get_int(f"{a}.value_length_mla")),
        sliding_window=window,
        swa_window=swa[0] if swa else 0,
        swa_layers=swa[1] if swa else None,
        kv_layers_from_start=kv_layers_from_start(arch, block_count or 0, shared),
        file_type=file_type,
        file_type_name=_file_type_name(file_type),
        parameter_count=sum(s.n_elements for s in headers) if complete else None,
        tensor_bytes=sum(by_type.values()),
        tensor_bytes_by_type=by_type,
        has_chat_template=bool(template),
        chat_template_mentions_tools="tools" in template,
        vocab_size=vocab if vocab is not None else h.array_length("tokenizer.ggml.tokens"),
        pooling_type=pooling,
        mtp_layers=mtp,
        split_count=split_count,
        split_no=h.get_int("split.no") or 0,
        shards_read=len(headers),
        decision_type=decision,
        is_embedding=caps.is_embedding_model(arch, pooling),
        output_modalities=caps.output_modalities(decision),
    )


def shard_paths(path: str | os.PathLike[str], split_count: int) -> list[str]:
    """All shard paths of a split model, named as llama_split_path does.

    `path` must be one shard (``<prefix>-00001-of-00003.gguf``); returns [path]
    when the name does not follow the pattern.
    """
    p = os.fspath(path)
    m = _SHARD.match(p)
    if m is None or split_count <= 1:
        return [p]
    return [f"{m.group(1)}-{i:05d}-of-{split_count:05d}.gguf" for i in range(1, split_count + 1)]


def read_model_facts(path: str | os.PathLike[str]) -> ModelFacts:
    """Read the model at `path`, with the sibling shards there are if it is split.

    Any shard may be given: the facts come from the first shard (``split.no`` 0),
    which is the one that carries the model's metadata.
    """
    given = read_header(path)
    count = given.get_int("split.count") or 1
    headers = [given] + [
        read_header(p)
        for p in shard_paths(path, count)
        if os.path.abspath(p) != os.path.abspath(given.path) and os.path.exists(p)
    ]
    first = next((h for h in headers if (h.get_int("split.no") or 0) == 0), given)
    return model_facts(first, [h for h in headers if h is not first])


def _largest(value: object) -> int | None:
    """An int, or the largest of a per-layer list of ints; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list | tuple):
        ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        return max(ints) if ints else None
    return None
