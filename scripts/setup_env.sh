#!/usr/bin/env bash
# Create or reuse the project's virtual environment with everything pinned,
# Horovod 0.28.1 included. One script for the Makefile, CI and the Dockerfile,
# so the three cannot drift.
#
#   scripts/setup_env.sh            # .venv in the repository root
#   VENV=/opt/venv scripts/setup_env.sh
#
# Environment:
#   VENV                 where the venv lives (default: .venv)
#   PYTHON               interpreter to create it with (default: python3.11, else python3)
#   BLOCKSYNC_WHEEL_CACHE  where built Horovod wheels are kept (default: ~/.cache/blocksync/wheels)
#   BLOCKSYNC_CUDA=1     build Horovod with NCCL GPU operations (CUDA images)
#   BLOCKSYNC_JVM_ARCHIVE=0  do not record the JVM class archive local sessions start with
#   BLOCKSYNC_DEPS_ONLY=1  install the pinned packages and Horovod but not blocksync itself (the
#                        Dockerfile's dependency layer, so a source change does not reinstall them)
#
# Horovod 0.28.1 (the last release) does not build from its sdist against
# torch >= 2.1 as is: its CMake files ask for C++14 and torch's headers need
# C++17, and its bundled gloo needs CMake < 4. We patch the unpacked sdist and
# build a wheel once; the wheel is cached outside the repository, keyed by the
# horovod, torch and Python versions, so later set-ups install it in seconds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
VENV=${VENV:-.venv}
HOROVOD_VERSION=0.28.1
CACHE=${BLOCKSYNC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blocksync/wheels}

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# --- prerequisites, each named when missing ---------------------------------
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
elif command -v python3.11 >/dev/null 2>&1; then
  py=python3.11
else
  py=python3
fi
command -v "$py" >/dev/null 2>&1 || die "Python 3.11 not found ($py). Install Python 3.11 or set PYTHON=/path/to/python3.11."
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$pyver" = "3.11" ] || die "Python 3.11 is required (torch 2.13.0 CPU wheel and the Horovod build are pinned to it); $py is $pyver. Set PYTHON=/path/to/python3.11."

command -v java >/dev/null 2>&1 || die "Java not found: Spark 4 needs Java 17. Install it (Debian: apt-get install openjdk-17-jre-headless) or put it on PATH / set JAVA_HOME."
javaver=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
case "$javaver" in
  17*|21*) ;;
  *) die "Java 17 is required by Spark 4 (found '$javaver'). Install openjdk-17 and put it first on PATH." ;;
esac

# A Horovod build is needed unless the cache holds a wheel for the pinned torch.
torch_pin=$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' requirements.lock)
variant=cpu
[ "${BLOCKSYNC_CUDA:-0}" = 1 ] && variant=cuda
# "p2": the two source patches below; a new patch must not reuse an older wheel.
key="horovod-${HOROVOD_VERSION}p2_torch-${torch_pin}_cp${pyver/./}_${variant}"
wheel_dir="$CACHE/$key"
if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1 && ! [ -f "$VENV/.blocksync-setup" ]; then
  command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
    || die "no C++ compiler found, and no cached Horovod wheel in $wheel_dir: Horovod is built from source. Install one (Debian: apt-get install g++)."
fi

# --- the venv and the pinned packages ---------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV with $py"
  "$py" -m venv "$VENV"
fi
vpy="$VENV/bin/python"
# This machine's pip config names local file indexes that lack most projects; drop that noise.
quiet_pip() {
  # pipefail: pip's own exit status wins; grep finding nothing to print (status 1) is fine.
  "$vpy" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || [ $? -eq 1 ]; }
}
pip_install() { quiet_pip install --disable-pip-version-check --no-input "$@"; }

stamp="$VENV/.blocksync-setup"
want=$(cat requirements.lock pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)-${BLOCKSYNC_CUDA:-0}
# Finding horovod.torch, not importing it: the import loads torch (over a second on every `make`), and the
# stamp already covers the pins the wheel was built against.
# The class-data-sharing archive of the JVM's classes (blocksync/pipeline/jvm_archive.py): local sessions
# map it instead of loading Spark's classes one by one. Recorded by running the demo once (about 45 s).
archive="$VENV/share/blocksync/spark-classes.jsa"
record_archive() {
  [ "${BLOCKSYNC_JVM_ARCHIVE:-1}" = 0 ] && return 0
  say "recording the JVM class archive $archive (runs the demo once, about 45 s)"
  "$vpy" -m blocksync.pipeline.jvm_archive --config conf/local.yaml >&2 \
    || say "WARNING: recording $archive failed (above); local sessions start without it, about 3 s slower."
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
  && "$vpy" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("horovod.torch") is None)' 2>/dev/null; then
  [ -f "$archive" ] && [ -f "$archive.bytes" ] || record_archive
  say "environment $VENV is up to date (remove $stamp to force a reinstall)"
  exit 0
fi

say "installing pinned packages into $VENV (first run: a few minutes)"
pip_install -q -r requirements.lock
[ "${BLOCKSYNC_DEPS_ONLY:-0}" = 1 ] || pip_install -q --no-deps -e .

torch_version=$("$vpy" -c 'import torch; print(torch.__version__.split("+")[0])')
[ "$torch_version" = "$torch_pin" ] || die "installed torch $torch_version differs from the pin $torch_pin in requirements.lock."

installed_ok() {
  "$vpy" - <<'EOF' 2>/dev/null
import horovod, horovod.torch as hvd
assert horovod.__version__ == "0.28.1"
assert hvd.gloo_built()
EOF
}

if installed_ok; then
  say "horovod $HOROVOD_VERSION already installed and importable"
else
  whl=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$whl" ]; then
    command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
      || die "no C++ compiler found: Horovod is built from source. Install one (Debian: apt-get install g++)."
    cmake_ok=no
    if command -v cmake >/dev/null 2>&1; then
      cmv=$(cmake --version | awk 'NR==1 {print $3}')
      case "$cmv" in 3.*) cmake_ok=yes ;; esac
    fi
    if [ "$cmake_ok" = no ]; then
      say "Horovod's bundled gloo needs CMake 3.x; installing cmake<4 into $VENV"
      pip_install -q 'cmake>=3.20,<4' || die "CMake 3.x not found and 'pip install cmake<4' failed. Install CMake 3.x (Debian: apt-get install cmake)."
      export PATH="$root/$VENV/bin:$PATH"
    fi
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    say "downloading the horovod $HOROVOD_VERSION sdist"
    quiet_pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build" \
      || die "could not download the horovod $HOROVOD_VERSION sdist from the package index."
    tar -xzf "$build"/horovod-"$HOROVOD_VERSION".tar.gz -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # torch >= 2.1 headers need C++17; Horovod 0.28.1 asks for C++14.
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || die "patching horovod's CMake files failed (layout changed?)"
    # A process-set Gloo context builds its device from its own gloo_iface_, which
    # is never set. With an empty interface Gloo binds to whatever the hostname
    # resolves to (127.0.0.1 on Debian-style hosts), and multi-host runs fail with
    # "connect [127.0.0.1]:port: Connection refused". Use the global context's.
    ctx="$src/horovod/common/gloo/gloo_context.cc"
    sed -i '/GlooContext::InitializeForProcessSet/,/CreateDevice/ s/device_attr.iface = gloo_iface_;/device_attr.iface = global_context.gloo_iface_;/' "$ctx"
    grep -q 'device_attr.iface = global_context.gloo_iface_;' "$ctx" || die "patching horovod's gloo_context.cc failed (layout changed?)"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
           HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    [ "$variant" = cuda ] && export HOROVOD_GPU_OPERATIONS=NCCL
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    log="$build/build.log"
    say "building horovod $HOROVOD_VERSION against torch $torch_version (about 4 minutes on 2 cores; log: $log)"
    ( "$vpy" -m pip wheel -v --no-deps --no-build-isolation "$src" -w "$build/dist" >"$log" 2>&1 ) &
    pid=$!
    start=$(date +%s)
    while kill -0 "$pid" 2>/dev/null; do
      sleep 30
      kill -0 "$pid" 2>/dev/null && say "  still building horovod ($(( $(date +%s) - start ))s): $(tail -n 1 "$log" | cut -c1-100)"
    done
    if ! wait "$pid"; then
      tail -n 40 "$log" >&2
      die "the horovod build failed; the last 40 lines of its log are above."
    fi
    mkdir -p "$wheel_dir"
    cp "$build"/dist/horovod-*.whl "$wheel_dir/"
    whl=$(ls "$wheel_dir"/horovod-*.whl | head -n 1)
    say "built $(basename "$whl") in $(( $(date +%s) - start ))s; cached in $wheel_dir"
  else
    say "reusing cached wheel $whl"
  fi
  pip_install -q --no-deps --force-reinstall "$whl"
  installed_ok || die "horovod installed from $whl but does not import with Gloo; remove $wheel_dir and rerun."
fi

if [ "${BLOCKSYNC_DEPS_ONLY:-0}" = 1 ]; then
  say "dependencies installed into $VENV (BLOCKSYNC_DEPS_ONLY=1: blocksync itself not installed, no stamp)"
  exit 0
fi
rm -f "$archive" "$archive.bytes"  # the pins changed: against the old jars a JVM would only warn and skip it
record_archive
echo "$want" > "$stamp"
say "ready: $("$vpy" -c 'import torch, pyspark, horovod; print(f"torch {torch.__version__}, pyspark {pyspark.__version__}, horovod {horovod.__version__}")')"
