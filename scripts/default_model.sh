# shellcheck shell=bash
# Sourced by run_main_job.sh and bench.sh: the default model as a safetensors folder, converted
# once from the GGUF that setup.sh fetched. Sets $gguf and $model; needs $qlm.
cache="${QLM_CACHE:-$HOME/.cache/qlm}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
model="$cache/SmolLM2-135M-Instruct"
if [ ! -f "$model/model.safetensors" ]; then
    echo "qlm: converting the default model once: $gguf -> $model" >&2
    "$qlm" convert "$gguf" "$model.tmp" --dtype bf16
    rm -rf "$model" && mv "$model.tmp" "$model"
fi
