#!/usr/bin/env bash
# Runs the loader fuzzer (fuzz/fuzz_loaders.c, built with libFuzzer, ASan and UBSan) on each target
# for FUZZ_SECONDS (default 60), in turn, on corpora under build/fuzz/corpus/TARGET seeded from the
# real assets and the test fixtures; findings go to build/fuzz/crashes/. Exits non-zero when any
# target found a crash, a leak or undefined behaviour.
#   scripts/fuzz.sh BIN [TARGET ...]     (default: every target)
set -uo pipefail

bin=$1; shift
secs=${FUZZ_SECONDS:-60}
assets=${QLM_ASSETS:-../shared/assets}
out=$(dirname "$(dirname "$bin")")  # build/fuzz
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors gguf llama2c tokenizer_json spiece tokenizer_bin hf_config lora_config json train_data chat_template)

seeds() {
    case "$1" in
        safetensors) ls "$assets"/tinystories-656K-hf/*.safetensors tests/fixtures/safetensors/*.safetensors tests/fixtures/lora/*/adapter_model.safetensors ;;
        gguf) ls tests/fixtures/gguf/*.gguf ;;
        llama2c) ls "$assets"/stories260K/stories260K.bin ;;
        tokenizer_json) ls "$assets"/tinystories-656K-hf/tokenizer.json "$assets"/flan-t5-small/tokenizer.json ;;
        spiece) ls "$assets"/flan-t5-small/spiece.model "$assets"/llama2-tokenizer/tokenizer.model ;;
        tokenizer_bin) ls "$assets"/stories260K/tok512.bin ;;
        hf_config) ls "$assets"/*/config.json ;;
        lora_config) ls tests/fixtures/lora/*/adapter_config.json ;;
        json) ls tests/fixtures/chat/*.json tests/fixtures/lora/*/adapter_config.json ;;
        train_data) ls tests/fixtures/train_data/*.jsonl ;;
        chat_template) ls "$assets"/tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer_config.json tests/fixtures/jinja/cases.json ;;
    esac
}

failed=()
mkdir -p "$out/crashes"
for t in "${targets[@]}"; do
    corpus="$out/corpus/$t"
    if [ ! -d "$corpus" ]; then
        mkdir -p "$corpus"
        files=$(seeds "$t") || { echo "fuzz: $t: seed files missing (assets in $assets?)" >&2; exit 1; }
        for f in $files; do cp "$f" "$corpus/seed-$(basename "$(dirname "$f")")-$(basename "$f")"; done
        if [ "$t" = train_data ]; then head -n 20 "$assets"/dialogsum/dialogsum.dev.jsonl > "$corpus/seed-dialogsum.jsonl"; fi
    fi
    echo "fuzz: $t for ${secs}s ($(ls "$corpus" | wc -l) inputs in $corpus)" >&2
    QLM_FUZZ_TARGET=$t QLM_FUZZ_TOKENIZER="$assets/stories260K/tok512.bin" \
        "$bin" "$corpus" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$out/crashes/$t-" 2>"$out/$t.log"
    rc=$?
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$out/$t.log" | tr '\n' ' ' >&2; echo >&2
    if [ $rc -ne 0 ]; then
        echo "fuzz: $t FAILED (rc $rc): see $out/$t.log and $out/crashes/" >&2
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: findings in: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets clean" >&2
