"""Header read time: troupe's streaming reader vs gguf.GGUFReader.

Writes a synthetic GGUF with a Qwen-sized tokenizer (151,936 tokens, 150,000
merges) into a temporary directory, reads it with both readers and prints the
best of a few runs for each and the ratio.

    .venv/bin/python bench/gguf_header.py [--repeat N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from troupe.gguf import SkippedArray, read_header, read_model_facts

N_TOKENS = 151_936
N_MERGES = 150_000


def write_big_vocab(path: Path) -> None:
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("bench-vocab")
    w.add_context_length(32768)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv([2, 2])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"token-{i}" for i in range(N_TOKENS)])
    w.add_token_merges([f"m{i} n{i}" for i in range(N_MERGES)])
    w.add_token_types([1] * N_TOKENS)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of troupe's reader (best kept)")
    ap.add_argument("--repeat-ref", type=int, default=1, help="runs of GGUFReader (slow)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big-vocab.gguf"
        t0 = time.perf_counter()
        write_big_vocab(path)
        size = path.stat().st_size
        print(f"wrote {path.name}: {size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")

        header = read_header(path)
        tokens = header.get("tokenizer.ggml.tokens")
        assert tokens == SkippedArray(gguf.GGUFValueType.STRING, N_TOKENS), tokens
        ref = gguf.GGUFReader(path)
        assert header.data_offset == ref.data_offset
        assert len(ref.fields["tokenizer.ggml.tokens"].data) == N_TOKENS

        mine = best_of(args.repeat, lambda: read_header(path))
        facts = best_of(args.repeat, lambda: read_model_facts(path))
        theirs = best_of(args.repeat_ref, lambda: gguf.GGUFReader(path))

    print(f"troupe read_header       : {mine * 1e3:9.1f} ms  (best of {args.repeat})")
    print(f"troupe read_model_facts  : {facts * 1e3:9.1f} ms  (best of {args.repeat})")
    print(f"gguf.GGUFReader          : {theirs * 1e3:9.1f} ms  (best of {args.repeat_ref})")
    print(f"ratio GGUFReader / troupe: {theirs / mine:9.0f} x")


if __name__ == "__main__":
    main()
