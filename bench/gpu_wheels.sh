#!/usr/bin/env bash
# The wheels troupe and bench/gpu_check.py need on a GPU machine that reaches no package
# registry (Python 3.12, x86_64): downloaded here, at the lock's versions, into .whl/
# (git-ignored through .git/info/exclude), to travel with the working tree. There:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:src:tests/support python3 bench/gpu_check.py
#
# numpy is the machine's own (PyTorch's image has it); the engine's sdist travels as
# .venv/llama-suite/ (scripts/_venv.sh ensure_llama_suite).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
names=(trio outcome sniffio sortedcontainers trio-websocket wsproto h11 httptools cattrs
  attrs nvidia-ml-py prometheus-client gguf psutil httpx httpcore anyio idna certifi
  typing-extensions werkzeug markupsafe pyyaml tqdm)
pins=()
for name in "${names[@]}"; do
  pin="$(grep -i "^${name}==" requirements/lock.txt || true)"
  pins+=("${pin:-$name}")
done
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${pins[@]}"
du -sh .whl
