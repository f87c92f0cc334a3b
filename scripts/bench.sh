#!/usr/bin/env bash
# `make bench`: measures qlm on the default model (SmolLM2-135M-Instruct) in F32, BF16 and INT8
# on this machine, in one run, and writes docs/benchmarks.md. Ratios matter more than absolute
# numbers: the decode rate is compared with the memory-bandwidth bound measured in the same run.
# If the Python package llama_cpp (llama-cpp-python) is importable, llama.cpp is measured on the
# same model converted to Q8_0 for comparison; if QLM_LLAMA_BENCH names a llama-bench binary (built
# outside the repository from the llama-cpp-python sdist's vendored sources, with llama-quantize
# beside it: `scripts/build_llama_bench.sh DIR native` makes DIR/llama-bench, and DIR is then
# QLM_LLAMA_CPP_SRC below), both engines run the same GGUF files: the default Q4_1 and its Q8_0 and Q4_0
# requantizations (dev-time only; never part of qlm). With QLM_LLAMA_CPP_SRC (those sources'
# llama.cpp folder) and QLM_LLAMA_PYTHON (a Python that runs its convert_hf_to_gguf.py) too, both
# also run a model of TinyLlama-1.1B's shape with random weights; QLM_BENCH_ONLY=llama1b runs that
# section alone and prints it instead of writing docs/benchmarks.md. QLM_LLAMA_BENCH_AVX2 names a
# llama-bench built for AVX2 alone (`scripts/build_llama_bench.sh DIR avx2`):
# both engines then also run the default model's GGUFs with only AVX2, as a CPU without AVX-512
# would (QLM_BENCH_ONLY=avx2 prints that section alone). Where QLM_BENCH_PYTHON (python3 unless set)
# imports ctranslate2, torch and transformers, CTranslate2 summarizes the same dialogues as qlm
# (QLM_BENCH_ONLY=ct2 prints that section alone).
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/default_model.sh
assets="${QLM_ASSETS:-../shared/assets}"
reps=${QLM_BENCH_REPS:-3}
n_dialogues=${QLM_BENCH_DIALOGUES:-32}
summary_tokens=${QLM_BENCH_SUMMARY_TOKENS:-64}
summary_reps=${QLM_BENCH_SUMMARY_REPS:-3}
threads=$(nproc)
out=docs/benchmarks.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The W8A8 panels of the files measured (temporary requantizations among them) go to the temp
# dir, not the user's cache: every run starts without them and leaves nothing behind.
export QLM_CACHE="$tmp/qlm-cache"

# The expression in parentheses: a bare ">" in awk would redirect the output to a file.
calc() { awk "BEGIN { printf \"%.6f\", ($1) }"; }
json_field() { sed -n "s/.*\"$2\":[[:space:]]*\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1"; }
llama_bench=${QLM_LLAMA_BENCH:-}
llama_quantize=$(dirname "$llama_bench")/llama-quantize
# avg_ts of llama-bench's test with n_prompt p and n_gen g, from its JSON.
llama_ts() {
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    if r["n_prompt"] == int(sys.argv[2]) and r["n_gen"] == int(sys.argv[3]):
        print("%.1f" % r["avg_ts"])' "$1" "$2" "$3"
}
# Runs a command with its output in $tmp/step.log, shown only when it fails.
logged() { "$@" > "$tmp/step.log" 2>&1 || { cat "$tmp/step.log" >&2; echo "bench: failed: $*" >&2; exit 1; }; }
# A section's heading; with a reason the section was not measured, that line too, and status 1.
section_head() {
    echo "## $1"
    echo
    [ -z "$2" ] && return 0
    echo "Not measured: $2"
    return 1
}
# Runs a command as logged does and keeps in FILE the least wall time it has taken so far.
best_time() {
    local file=$1
    shift
    logged /usr/bin/time -f %e -o "$tmp/time" "$@"
    if [ ! -f "$file" ] || awk -v a="$(cat "$tmp/time")" -v b="$(cat "$file")" 'BEGIN { exit !(a < b) }'; then
        cp "$tmp/time" "$file"
    fi
}

# Both engines on a model of TinyLlama-1.1B's shape (its config and tokenizer are in the assets, its
# weights need not be: speed does not depend on their values): qlm's random BF16 weights as a
# safetensors folder, converted by llama.cpp's own converter to BF16 and Q8_0 GGUFs and by
# llama-quantize to Q4_0. qlm runs each pair's GGUF as stored and the same dtype from the folder.
# qlm's panel cache goes to $tmp, not the user's: these models live only as long as the run.
reps_1b=${QLM_BENCH_1B_REPS:-2}
llama_1b_skip=""
llama_1b_pairs=("BF16 – BF16|bf16|bf16|safetensors folder, --dtype bf16"
    "INT8 – Q8_0|q8_0|q8_0|the Q8_0 GGUF as stored"
    "INT8 – Q8_0|q8_0|int8|safetensors folder, --dtype int8"
    "INT4 group 32 – Q4_0|q4_0|q4_0|the Q4_0 GGUF as stored"
    "INT4 group 32 – Q4_0|q4_0|q4_0-g32|safetensors folder, --dtype q4_0 --group 32")
bench_llama_1b() {
    local src=${QLM_LLAMA_CPP_SRC:-} py=${QLM_LLAMA_PYTHON:-} dir="$tmp/tinyllama" t spec name model flags round
    local t0=$SECONDS
    if [ -z "$llama_bench" ] || [ ! -x "$llama_bench" ]; then
        llama_1b_skip="QLM_LLAMA_BENCH does not name a llama-bench binary"; return
    fi
    if [ -z "$src" ] || [ ! -f "$src/convert_hf_to_gguf.py" ] || [ ! -d "$src/gguf-py" ]; then
        llama_1b_skip="QLM_LLAMA_CPP_SRC does not name a llama.cpp source folder (convert_hf_to_gguf.py, gguf-py/)"; return
    fi
    if [ -z "$py" ] || ! PYTHONPATH="$src/gguf-py" "$py" "$src/convert_hf_to_gguf.py" --help > /dev/null 2>&1; then
        llama_1b_skip="QLM_LLAMA_PYTHON does not name a Python that runs $src/convert_hf_to_gguf.py"; return
    fi
    echo "bench: TinyLlama-1.1B shape: random BF16 weights, GGUF conversions ..." >&2
    logged "$qlm" quantize "$assets/tinyllama-1.1b-chat-v1.0-tokenizer" "$dir" --dtype bf16 --random-weights
    for t in bf16 q8_0; do
        logged env PYTHONPATH="$src/gguf-py" "$py" "$src/convert_hf_to_gguf.py" "$dir" --outtype "$t" \
            --outfile "$tmp/tinyllama-$t.gguf"
    done
    logged "$llama_quantize" "$tmp/tinyllama-bf16.gguf" "$tmp/tinyllama-q4_0.gguf" Q4_0
    # Each load is timed right after the same engine's bench run of the same model: the file is in
    # the page cache for both, and qlm's W8A8 panels are already in its cache.
    for t in bf16 q8_0 q4_0; do
        echo "bench: llama-bench TinyLlama-1.1B shape, $t ..." >&2
        /usr/bin/time -f %M -o "$tmp/1b-llama-$t.rss" "$llama_bench" -m "$tmp/tinyllama-$t.gguf" -t "$threads" \
            -p 512 -n 128 -r "$reps_1b" -o json > "$tmp/1b-llama-$t.json" 2> "$tmp/step.log" ||
            { cat "$tmp/step.log" >&2; exit 1; }
    done
    local specs=("bf16|$dir|--dtype bf16" "q8_0|$tmp/tinyllama-q8_0.gguf|" "int8|$dir|--dtype int8"
        "q4_0|$tmp/tinyllama-q4_0.gguf|" "q4_0-g32|$dir|--dtype q4_0 --group 32")
    for spec in "${specs[@]}"; do
        IFS='|' read -r name model flags <<< "$spec"
        echo "bench: qlm TinyLlama-1.1B shape, $name ..." >&2
        "$qlm" bench -m "$model" $flags --threads "$threads" --pp 512 --tg 128 \
            --reps "$reps_1b" --json > "$tmp/1b-qlm-$name.json"
    done
    # Load times: three interleaved rounds over both engines, each one's best (the files in the
    # page cache, qlm's W8A8 panels written to its cache by the bench runs above).
    echo "bench: TinyLlama-1.1B shape, load times ..." >&2
    for round in 1 2 3; do
        for t in bf16 q8_0 q4_0; do
            best_time "$tmp/1b-llama-$t.load" "$llama_bench" -m "$tmp/tinyllama-$t.gguf" -t "$threads" -p 0 -n 1 -r 1 \
                -o json
        done
        for spec in "${specs[@]}"; do
            IFS='|' read -r name model flags <<< "$spec"
            best_time "$tmp/1b-qlm-$name.load" "$qlm" generate -m "$model" $flags -p Hello -n 1 --threads "$threads"
        done
    done
    echo "bench: TinyLlama-1.1B shape section: $((SECONDS - t0)) s" >&2
}
# That section of docs/benchmarks.md, from bench_llama_1b's files.
llama_1b_section() {
    local spec pair lt qn what lpp ltg lrss lload q qpp qtg qrss qload
    local why="$llama_1b_skip (scripts/bench.sh says what QLM_LLAMA_BENCH, QLM_LLAMA_CPP_SRC and
QLM_LLAMA_PYTHON name)."
    section_head "qlm and llama.cpp on a TinyLlama-1.1B-shaped model" "${llama_1b_skip:+$why}" || return 0
    echo "A model of TinyLlama-1.1B-Chat's config with random weights (\`qlm quantize --random-weights --dtype bf16\`, a"
    echo "safetensors folder), converted by the llama.cpp sources' convert_hf_to_gguf.py to BF16 and Q8_0 GGUFs and by"
    echo "llama-quantize to Q4_0 (its default mix: output.weight in Q6_K, which qlm runs as Q8_0). llama.cpp's"
    echo "\`llama-bench\` runs each GGUF; \`qlm bench\` runs the same GGUF as stored and the same dtype from the safetensors"
    echo "folder, qlm's default activations (W8A8 for the block types on CPUs with AVX2 or AVX-512), $threads threads,"
    echo "the mean of $reps_1b runs each, same run. Peak RSS: \`/usr/bin/time\` of the whole llama-bench run, qlm bench's own"
    echo "(the process's maximum RSS). Load s: wall time of \`llama-bench -p 0 -n 1 -r 1\` (model load, its warm-up"
    echo "decode and one timed token) and of \`qlm generate -p Hello -n 1\` (load, a 2-token prompt, one token), the"
    echo "best of three rounds that take both engines in turn, after the bench runs (files in the page cache; qlm's"
    echo "W8A8 panels already written to its cache). Ratios are qlm / llama.cpp."
    echo
    echo "| pair (qlm – llama.cpp) | qlm runs | llama.cpp pp512 | qlm pp512 | ratio | llama.cpp tg128 | qlm tg128 | ratio | llama.cpp RSS MiB | qlm RSS MiB | ratio | llama.cpp load s | qlm load s | ratio |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for spec in "${llama_1b_pairs[@]}"; do
        IFS='|' read -r pair lt qn what <<< "$spec"
        lpp=$(llama_ts "$tmp/1b-llama-$lt.json" 512 0); ltg=$(llama_ts "$tmp/1b-llama-$lt.json" 0 128)
        lrss=$(calc "$(cat "$tmp/1b-llama-$lt.rss") / 1024"); lload=$(cat "$tmp/1b-llama-$lt.load")
        q="$tmp/1b-qlm-$qn.json"
        qpp=$(json_field "$q" pp_tps); qtg=$(json_field "$q" tg_tps); qrss=$(json_field "$q" peak_rss_mib)
        qload=$(cat "$tmp/1b-qlm-$qn.load")
        printf "| %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f |\n" \
            "$pair" "$what" "$lpp" "$qpp" "$(calc "$qpp / $lpp")" "$ltg" "$qtg" "$(calc "$qtg / $ltg")" \
            "$lrss" "$qrss" "$(calc "$qrss / $lrss")" "$lload" "$qload" "$(calc "$qload / $lload")"
    done
    echo
    echo "qlm's own measures of each row (its bench JSON): peak RSS over what it allocates and maps for the run"
    echo "(every weight, the KV caches of 640 positions and the activation buffers of a 512-row prefill; code,"
    echo "libraries and tokenizer are the rest), and tg128 over the bandwidth bound measured beside it:"
    echo
    for spec in "${llama_1b_pairs[@]}"; do
        IFS='|' read -r pair lt qn what <<< "$spec"
        q="$tmp/1b-qlm-$qn.json"
        printf -- "- %s, %s: RSS %.2fx (%.0f MiB of weights + %.0f MiB of caches and buffers), decode %.0f%% of the bound\n" \
            "$pair" "$what" \
            "$(calc "$(json_field "$q" peak_rss_mib) * 1048576 / ($(json_field "$q" model_bytes) + $(json_field "$q" state_bytes))")" \
            "$(calc "$(json_field "$q" model_bytes) / 1048576")" "$(calc "$(json_field "$q" state_bytes) / 1048576")" \
            "$(calc "100 * $(json_field "$q" tg_fraction_of_bound)")"
    done
}

# Both engines with AVX2 alone on the default model's Q4_1 file and its Q4_0 and Q8_0 requantizations:
# llama.cpp's AVX2 build (QLM_LLAMA_BENCH_AVX2) and qlm's AVX2 kernels (QLM_ISA=avx2; W8A8 by default).
avx2_skip=""
avx2_types=(Q4_0 Q4_1 Q8_0)
bench_avx2() {
    local b=${QLM_LLAMA_BENCH_AVX2:-} t f
    if [ -z "$b" ] || [ ! -x "$b" ]; then avx2_skip="QLM_LLAMA_BENCH_AVX2 does not name a llama-bench binary"; return; fi
    for t in "${avx2_types[@]}"; do
        f="$gguf"
        if [ "$t" != Q4_1 ]; then
            f="$tmp/avx2-$t.gguf"
            logged "$(dirname "$b")/llama-quantize" --allow-requantize "$gguf" "$f" "$t"
        fi
        echo "bench: AVX2 alone, $t: llama-bench, then qlm ..." >&2
        "$b" -m "$f" -t "$threads" -p 512 -n 128 -r "$reps" -o json > "$tmp/avx2-llama-$t.json" 2> "$tmp/step.log" ||
            { cat "$tmp/step.log" >&2; exit 1; }
        QLM_ISA=avx2 "$qlm" bench -m "$f" --threads "$threads" --pp 512 --tg 128 --reps "$reps" --json > "$tmp/avx2-qlm-$t.json"
    done
}
avx2_section() {
    local t l q lpp ltg
    section_head "qlm and llama.cpp with AVX2 alone" \
        "${avx2_skip:+$avx2_skip (scripts/bench.sh says how to build one).}" || return 0
    echo "What a CPU without AVX-512 gets: llama.cpp's \`llama-bench\` built from the same sources for AVX2 alone"
    echo "(\`-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF\`) and \`qlm bench\` with its AVX2 kernels"
    echo "(\`QLM_ISA=avx2\`: W8A8 through VPMADDUBSW, the default) on the default model's Q4_1 file and its Q4_0 and"
    echo "Q8_0 requantizations by llama-quantize, $threads threads, $reps repetitions, same run."
    echo
    echo "| GGUF type | llama.cpp pp512 | qlm pp512 | ratio | llama.cpp tg128 | qlm tg128 | ratio | qlm tg / bound |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for t in "${avx2_types[@]}"; do
        l="$tmp/avx2-llama-$t.json"; q="$tmp/avx2-qlm-$t.json"
        lpp=$(llama_ts "$l" 512 0); ltg=$(llama_ts "$l" 0 128)
        printf "| %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.0f%% |\n" "$t" "$lpp" "$(json_field "$q" pp_tps)" \
            "$(calc "$(json_field "$q" pp_tps) / $lpp")" "$ltg" "$(json_field "$q" tg_tps)" \
            "$(calc "$(json_field "$q" tg_tps) / $ltg")" "$(calc "100 * $(json_field "$q" tg_fraction_of_bound)")"
    done
}

# Both engines summarizing the same DialogSum dialogues on the CPU: CTranslate2 (its Python package,
# dev-time only, run by bench/ct2_bench.py with QLM_BENCH_PYTHON) on models of SmolLM2-135M's and
# flan-t5-base's configs with random weights, converted by its own converter; qlm with its own random
# weights of the same configs. Both generate exactly $summary_tokens tokens a dialogue (CTranslate2's
# min length; random weights never pick EOS first in practice, and each engine's count is printed).
ct2_skip=""
ct2_models=("SmolLM2-135M|$model" "flan-t5-base|$assets/flan-t5-base")
# qlm weights | qlm flags | CTranslate2 quantization
ct2_kinds=("F32|--dtype f32|float32" "INT8 per channel, 16-bit x|--dtype int8 --per-channel|int8"
    "Q8_0, W8A8|--dtype q8_0 --w8a8|int8")
ct2_batches=(1 32)
bench_ct2() {
    local py=${QLM_BENCH_PYTHON:-python3} m name path k label flags quant bs
    if ! "$py" -c "import ctranslate2, torch, transformers" 2> /dev/null; then
        ct2_skip="$py cannot import ctranslate2, torch and transformers (set QLM_BENCH_PYTHON to a Python that can)"
        return
    fi
    ct2_version=$("$py" -c "import ctranslate2; print(ctranslate2.__version__)")
    head -n "$n_dialogues" "$assets/dialogsum/dialogsum.test.jsonl" > "$tmp/ct2-dialogues.jsonl"
    for m in "${ct2_models[@]}"; do
        IFS='|' read -r name path <<< "$m"
        for quant in float32 int8; do
            echo "bench: CTranslate2 converting $name ($quant) ..." >&2
            logged "$py" bench/ct2_bench.py convert "$path" "$tmp/ct2-$name-$quant" "$quant"
        done
        for k in "${ct2_kinds[@]}"; do
            IFS='|' read -r label flags quant <<< "$k"
            for bs in "${ct2_batches[@]}"; do
                echo "bench: $name, $label, batch $bs: qlm, then CTranslate2 ..." >&2
                logged "$qlm" summarize -m "$path" --random-weights $flags --threads "$threads" \
                    --batch "$tmp/ct2-dialogues.jsonl" --out "$tmp/ct2-out.jsonl" --batch-size "$bs" -n "$summary_tokens"
                rm -f "$tmp/ct2-out.jsonl"
                grep '^summarize: .* dialogues in ' "$tmp/step.log" > "$tmp/ct2-qlm-$name-$label-$bs.log"
                # CTranslate2 at the faster of one thread and $threads: on a 2-core VM its two threads
                # ran slower than one (3.8 vs 5.8 s for two dialogues, whatever KMP_BLOCKTIME or
                # OMP_WAIT_POLICY said).
                for t in $(printf '%s\n' 1 "$threads" | sort -un); do
                    "$py" bench/ct2_bench.py run "$tmp/ct2-$name-$quant" "$path" "$tmp/ct2-dialogues.jsonl" "$bs" \
                        "$summary_tokens" "$t" > "$tmp/ct2-run.json" 2> "$tmp/step.log" ||
                        { cat "$tmp/step.log" >&2; exit 1; }
                    c="$tmp/ct2-$name-$label-$bs.json"
                    if [ ! -f "$c" ] || [ "$(calc "$(json_field "$tmp/ct2-run.json" seconds) < $(json_field "$c" seconds)")" = 1.000000 ]; then
                        sed "s/}\$/, \"threads\": $t}/" "$tmp/ct2-run.json" > "$c"
                    fi
                done
            done
        done
    done
}
ct2_section() {
    local m name path k label flags quant bs line qs qtok c cs ctok
    section_head "qlm and CTranslate2" "${ct2_skip:+$ct2_skip.}" || return 0
    echo "Batch summarization of the first $n_dialogues DialogSum test dialogues on the CPU, $threads threads, same run:"
    echo "\`qlm summarize --batch\` and CTranslate2 $ct2_version (bench/ct2_bench.py: its Generator for SmolLM2, its"
    echo "Translator for T5, one batch at a time after a warm-up batch, at the faster of intra_threads 1 and $threads) with the same prompts"
    echo "(SmolLM2's chat template; T5's plain prompt and </s>), greedy, exactly $summary_tokens new tokens each. Models of"
    echo "SmolLM2-135M-Instruct's and flan-t5-base's configs with random weights (speed does not depend on their"
    echo "values): qlm's own, and transformers' converted by CTranslate2's converter to float32 or int8 (its int8:"
    echo "weights with a scale per row, activations quantized to 8 bits per row as it multiplies). CTranslate2 on"
    echo "the CPU has no BF16; qlm's INT8 rows are its per-channel INT8 (x in 16 bits) and its Q8_0 with W8A8 (x"
    echo "in 8 bits, a scale per 32), both against CTranslate2's int8. Each engine tokenizes the folder's tokenizer.json."
    echo
    echo "| model | qlm weights – CTranslate2 | batch | qlm dialogues/s | CTranslate2 dialogues/s | qlm / CTranslate2 | qlm gen tok/s | CTranslate2 gen tok/s | CTranslate2 threads |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for m in "${ct2_models[@]}"; do
        IFS='|' read -r name path <<< "$m"
        for k in "${ct2_kinds[@]}"; do
            IFS='|' read -r label flags quant <<< "$k"
            for bs in "${ct2_batches[@]}"; do
                line=$(cat "$tmp/ct2-qlm-$name-$label-$bs.log")
                qs=$(sed 's/.* dialogues in \([0-9.]*\) s .*/\1/' <<< "$line")
                qtok=$(sed 's/.*), \([0-9]*\) tokens generated.*/\1/' <<< "$line")
                c="$tmp/ct2-$name-$label-$bs.json"
                cs=$(json_field "$c" seconds)
                ctok=$(json_field "$c" generated_tokens)
                printf "| %s | %s – %s | %s | %.2f | %.2f | %.2fx | %.1f | %.1f | %s |\n" "$name" "$label" "$quant" "$bs" \
                    "$(calc "$n_dialogues / $qs")" "$(calc "$n_dialogues / $cs")" "$(calc "$cs / $qs")" \
                    "$(calc "$qtok / $qs")" "$(calc "$ctok / $cs")" "$(json_field "$c" threads)"
            done
        done
    done
    echo
    for m in "${ct2_models[@]}"; do
        IFS='|' read -r name path <<< "$m"
        label=${ct2_kinds[0]%%|*}
        line=$(sed 's/.*steps; \([0-9]*\) of \([0-9]*\) prompt tokens.*/\1 \2/' "$tmp/ct2-qlm-$name-$label-1.log")
        ctok=$(json_field "$tmp/ct2-$name-$label-1.json" prompt_tokens)
        printf -- "- %s prompt tokens: qlm %s, CTranslate2 %s; qlm took %s of them from an earlier prompt's cache (a prefix\n" \
            "$name" "${line#* }" "$ctok" "${line%% *}"
        echo "  they share), CTranslate2 evaluates every prompt whole."
    done
}

only=${QLM_BENCH_ONLY:-}
case "$only" in
"") ;;
avx2)
    bench_avx2
    avx2_section
    exit 0
    ;;
llama1b)
    bench_llama_1b
    llama_1b_section
    exit 0
    ;;
ct2)
    bench_ct2
    ct2_section
    exit 0
    ;;
*) echo "bench: QLM_BENCH_ONLY=$only: the sections it can name are llama1b, avx2 and ct2" >&2; exit 2 ;;
esac

# "stored": the GGUF's own blocks (Q4_1 layers, Q8_0 embedding), no --dtype. Block types with
# 16-bit activations (--no-w8a8) and with W8A8 (--w8a8, their default on CPUs with AVX2 or AVX-512;
# elsewhere the flag changes nothing and the rows repeat the ones above them).
rows=()
for spec in "f32:" "bf16:" "f16:" "int8:" "int8:--per-channel" "q8_0:--no-w8a8" "q8_0:--w8a8" "q4_0:--no-w8a8" \
    "q4_0:--w8a8" "q4_1:--no-w8a8" "q4_1:--w8a8" "stored:--no-w8a8" "stored:--w8a8"; do
    dt=${spec%%:*}; extra=${spec#*:}
    echo "bench: $dt $extra ..." >&2
    dtype_flag=(--dtype "$dt")
    [ "$dt" = stored ] && dtype_flag=()
    "$qlm" bench -m "$gguf" "${dtype_flag[@]}" $extra --threads "$threads" --pp 512 --tg 128 --reps "$reps" --json \
        > "$tmp/$dt$extra.json"
    rows+=("$tmp/$dt$extra.json")
done

# W8A8 under each kernel set this CPU runs (QLM_ISA): what a CPU with only AVX2, AVX-VNNI or
# AVX-512 without VNNI gets, measured here. The default model requantized to Q4_0 at load.
isa_list=$(sed -n 's/.*this CPU runs: \([^;]*\);.*/\1/p' <<< "$("$qlm" info)")
isa_rows=()
for isa in $isa_list; do
    [ "$isa" = scalar ] && continue
    for x in --no-w8a8 --w8a8; do
        echo "bench: kernels $isa, q4_0 $x ..." >&2
        QLM_ISA=$isa "$qlm" bench -m "$gguf" --dtype q4_0 $x --threads "$threads" --pp 512 --tg 128 --reps "$reps" \
            --json > "$tmp/isa-$isa$x.json"
    done
    isa_rows+=("$isa")
done

# The default model's footprint run from its GGUF (the file's own blocks): peak RSS of a one-token
# generate and of summarizing README.md's dialogue, the least of three runs each.
echo "bench: default model peak RSS ..." >&2
scripts/demo_dialogue.sh > "$tmp/dialogue.txt"
least_rss() {
    local file=$1 round
    shift
    for round in 1 2 3; do
        logged /usr/bin/time -f %M -o "$tmp/rss" "$@"
        if [ ! -f "$file" ] || [ "$(cat "$tmp/rss")" -lt "$(cat "$file")" ]; then cp "$tmp/rss" "$file"; fi
    done
}
least_rss "$tmp/rss-generate" "$qlm" generate -m "$gguf" -p Hello -n 1 --threads "$threads" --quiet
least_rss "$tmp/rss-summarize" "$qlm" summarize -m "$gguf" --temp 0 --threads "$threads" --quiet "$tmp/dialogue.txt"
gguf_kib=$(( $(stat -c %s "$gguf") / 1024 ))

# llama.cpp's own llama-bench and qlm on the same GGUF files, one pair per type.
llama_pairs=()
if [ -n "$llama_bench" ] && [ -x "$llama_bench" ]; then
    for t in Q4_1 Q8_0 Q4_0; do
        f="$gguf"
        if [ "$t" != Q4_1 ]; then
            f="$tmp/smollm2-$t.gguf"
            "$llama_quantize" --allow-requantize "$gguf" "$f" "$t" > "$tmp/quantize.log" 2>&1 ||
                { cat "$tmp/quantize.log" >&2; exit 1; }
        fi
        echo "bench: llama-bench $t ..." >&2
        /usr/bin/time -f %M -o "$tmp/llama-$t.rss" "$llama_bench" -m "$f" -t "$threads" -p 512 -n 128 -r "$reps" \
            -o json > "$tmp/llama-$t.json" 2> "$tmp/llama-$t.err" || { cat "$tmp/llama-$t.err" >&2; exit 1; }
        echo "bench: qlm on the same $t file ..." >&2
        "$qlm" bench -m "$f" --no-w8a8 --threads "$threads" --pp 512 --tg 128 --reps "$reps" --json > "$tmp/qlm-$t.json"
        "$qlm" bench -m "$f" --w8a8 --threads "$threads" --pp 512 --tg 128 --reps "$reps" --json > "$tmp/qlm-w8a8-$t.json"
        llama_pairs+=("$t")
    done
fi
bench_llama_1b
bench_avx2
bench_ct2

# Batch summarization: the first DialogSum test dialogues through `qlm summarize --batch` at
# several batch sizes, for SmolLM2 and for a model of flan-t5-base's exact shape (random weights:
# its config.json is at hand, its weights are not), both in BF16.
head -n "$n_dialogues" "$assets/dialogsum/dialogsum.test.jsonl" > "$tmp/dialogues.jsonl"
# Rounds run the batch sizes in turn and each keeps its fastest run: on a shared machine a
# neighbour's burst slows one run by 10% or more, which a single run per size puts into the ratios.
summary_rows=()
for spec in "SmolLM2-135M-Instruct|$model|" "flan-t5-base shape, random weights|$assets/flan-t5-base|--random-weights"; do
    IFS='|' read -r name path extra <<< "$spec"
    declare -A best=()
    for round in $(seq "$summary_reps"); do
        for bs in 1 8 32; do
            echo "bench: summarize $name, batch size $bs, round $round of $summary_reps ..." >&2
            rm -f "$tmp/out.jsonl"
            "$qlm" summarize -m "$path" $extra --dtype bf16 --threads "$threads" --batch "$tmp/dialogues.jsonl" --out "$tmp/out.jsonl" \
                --batch-size "$bs" -n "$summary_tokens" 2> "$tmp/summarize.log"
            # "summarize: N dialogues in S s (D dialogues/s), T tokens generated (R tok/s), K decode steps;
            #  U of P prompt tokens reused from an earlier prompt's cache"
            line=$(grep '^summarize: .* dialogues in ' "$tmp/summarize.log")
            dps=$(sed 's/.*(\([0-9.]*\) dialogues\/s).*/\1/' <<< "$line")
            tps=$(sed 's/.*generated (\([0-9.]*\) tok\/s).*/\1/' <<< "$line")
            secs=$(sed 's/.* dialogues in \([0-9.]*\) s .*/\1/' <<< "$line")
            reused=$(sed 's/.*steps; \([0-9]* of [0-9]*\) prompt tokens.*/\1/' <<< "$line")
            if [ -z "${best[$bs]:-}" ] || [ "$(calc "$dps > ${best[$bs]%%|*}")" = 1.000000 ]; then
                best[$bs]="$dps|$secs|$tps|$reused"
            fi
        done
    done
    for bs in 1 8 32; do
        IFS='|' read -r dps secs tps reused <<< "${best[$bs]}"
        summary_rows+=("$name|$bs|$secs|$dps|$tps|$reused")
    done
    unset best
done

# LoRA: four rank-16 adapters on the attention projections of the default model (made by
# `qlm lora init`; B = 0 does not change the cost), through build/bench/bench_lora.
for i in 1 2 3 4; do
    "$qlm" lora init -m "$model" -o "$tmp/lora$i" --rank 16 --alpha 32 --targets q_proj,k_proj,v_proj,o_proj \
        --seed "$i" 2> /dev/null
done
echo "bench: LoRA adapters ..." >&2
lora_table=$("$(dirname "$qlm")/bench/bench_lora" "$model" "$tmp/lora1" "$tmp/lora2" "$tmp/lora3" "$tmp/lora4")

# HTTP server: `qlm serve` (BF16, 16 sequences) on a free loopback port, loaded by
# build/bench/bench_serve with 1, 4 and 16 concurrent streaming clients, in its two workloads.
echo "bench: HTTP server ..." >&2
"$qlm" serve -m "$model" --dtype bf16 --threads "$threads" --port 0 --max-seqs 16 --quiet > "$tmp/serve.out" 2> "$tmp/serve.err" &
serve_pid=$!
url=""
for _ in $(seq 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/serve.out" || true)
    [ -n "$url" ] && curl -sf "$url/health" > /dev/null && break
    kill -0 "$serve_pid" 2> /dev/null || { cat "$tmp/serve.err" >&2; exit 1; }
    sleep 0.1
done
serve_table=$("$(dirname "$qlm")/bench/bench_serve" "$url" chat) || { kill -TERM "$serve_pid"; exit 1; }
serve_table_raw=$("$(dirname "$qlm")/bench/bench_serve" "$url" completions | tail -n +3) || { kill -TERM "$serve_pid"; exit 1; }
kill -TERM "$serve_pid"
wait "$serve_pid"

# LoRA training: `qlm train` and transformers + peft (when QLM_BENCH_PYTHON, default python3, has
# torch, transformers and peft) on the same 32 DialogSum examples, rank, batch and threads.
train_steps=${QLM_BENCH_TRAIN_STEPS:-8}
echo "bench: LoRA training ..." >&2
awk -v n=$((train_steps * 4)) 'NR > n { exit } { print }' "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" |
    "$qlm" train -m "$model" --data /dev/stdin --out "$tmp/train" --steps "$train_steps" --batch 4 --seq-len 512 \
        --rank 16 --target-field summary --template $'Summarize the following conversation.\n\n{dialogue}\n\nSummary: ' \
        --lr 4e-4 --save-every 1000 --threads "$threads" 2> "$tmp/train.err" > /dev/null || { cat "$tmp/train.err" >&2; exit 1; }
train_qlm_tps=$(json_field "$tmp/train/summary.json" tokens_per_s)
train_qlm_rss=$(json_field "$tmp/train/summary.json" peak_rss_mib)
train_qlm_tokens=$(json_field "$tmp/train/summary.json" tokens)
train_peft=""
bench_python=${QLM_BENCH_PYTHON:-python3}
if "$bench_python" -c "import torch, transformers, peft" 2>/dev/null; then
    awk -v n=$((train_steps * 4)) 'NR > n { exit } { print }' "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" |
        "$bench_python" -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"prompt": "Summarize the following conversation.\n\n" + r["dialogue"] + "\n\nSummary: ",
                      "completion": r["summary"]}))' > "$tmp/train_pc.jsonl"
    train_peft=$("$bench_python" bench/peft_train_bench.py "$model" "$tmp/train_pc.jsonl" "$train_steps" 4 "$threads" \
        2>/dev/null | tail -n1 || true)
fi

llama_cpp=""
if python3 -c "import llama_cpp" 2>/dev/null; then
    echo "bench: llama.cpp (llama-cpp-python) ..." >&2
    llama_cpp=$(python3 bench/llama_cpp_bench.py "$gguf" "$threads" 2>/dev/null || true)
fi

{
    echo "# Benchmarks"
    echo
    echo "Written by \`make bench\` on $(date -u +%Y-%m-%d) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads,"
    echo "kernels: $(json_field "${rows[0]}" isa)). Model: SmolLM2-135M-Instruct (the default model; GGUF Q4_1 dequantized, then stored"
    echo "in the dtype of each row). pp512: prompt processing of 512 tokens; tg128: decoding 128 tokens one by one."
    echo "Mean and sd over $reps repetitions."
    echo
    echo "| weights | weight MiB/token | pp512 tok/s | tg128 tok/s | bandwidth bound tok/s | tg / bound | peak RSS MiB |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    for f in "${rows[@]}"; do
        label=$(json_field "$f" dtype)
        case "$f" in "$tmp"/stored*) label="as stored ($label + q8_0 embedding)" ;; esac
        case "$f" in *--no-w8a8.json) label="$label, --no-w8a8" ;; *--w8a8.json) label="$label, --w8a8" ;; esac
        printf "| %s | %.1f | %.1f ± %.1f | %.1f ± %.1f | %.1f | %.0f%% | %.0f |\n" "$label" \
            "$(calc "$(json_field "$f" weight_bytes) / 1048576")" "$(json_field "$f" pp_tps)" "$(json_field "$f" pp_sd)" \
            "$(json_field "$f" tg_tps)" "$(json_field "$f" tg_sd)" "$(json_field "$f" tg_bound_tps)" \
            "$(calc "100 * $(json_field "$f" tg_fraction_of_bound)")" "$(json_field "$f" peak_rss_mib)"
    done
    bf16=$(json_field "$tmp/bf16.json" tg_tps); i8=$(json_field "$tmp/int8.json" tg_tps); i8pc=$(json_field "$tmp/int8--per-channel.json" tg_tps)
    echo
    bws=$(for f in "${rows[@]}"; do json_field "$f" bandwidth_gbs; done | sort -g)
    printf "Memory bandwidth measured beside the INT8 decode repetitions: %.1f GB/s (best of several multi-threaded\n" \
        "$(json_field "$tmp/int8.json" bandwidth_gbs)"
    printf "read passes each time; each row is held to its own measurement, which ranged %.1f-%.1f GB/s over the rows of\n" \
        "$(head -1 <<< "$bws")" "$(tail -1 <<< "$bws")"
    printf "this run: the VM's bandwidth drifts between minutes, and the tg / bound column with it).\n\n"
    # The bound counts memory's bandwidth; weights that stay in the last-level cache beat it.
    over=$(for f in "${rows[@]}"; do json_field "$f" tg_fraction_of_bound; done | awk '$1 > 1' | wc -l)
    llc=$(getconf LEVEL3_CACHE_SIZE 2>/dev/null || echo 0)
    if [ "$over" -gt 0 ] && [ "${llc:-0}" -gt 0 ]; then
        printf "Rows above 100%% of the bound: this CPU's last-level cache (%.0f MiB) holds their weights between\n" \
            "$(calc "$llc / 1048576")"
        printf "tokens, so decode reads them from the cache, not from the memory whose bandwidth the bound counts.\n\n"
    fi
    printf -- "- INT8 decode / BF16 decode: **%.2fx** per tensor, **%.2fx** per channel (target ≥ 1.6x).\n" \
        "$(calc "$i8 / $bf16")" "$(calc "$i8pc / $bf16")"
    printf -- "- INT8 decode / bandwidth bound: **%.0f%%** (target ≥ 60%%).\n" \
        "$(calc "100 * $(json_field "$tmp/int8.json" tg_fraction_of_bound)")"
    if [ -n "$llama_cpp" ]; then
        echo "- llama.cpp (llama-cpp-python, same model requantized to Q8_0, $threads threads, same run): $llama_cpp"
    elif [ "${#llama_pairs[@]}" -gt 0 ]; then
        echo "- llama.cpp: its own llama-bench on the same GGUF files, in the sections below."
    else
        echo "- llama.cpp: not measured (the Python package llama_cpp is not installed on this machine)."
    fi
    printf -- "- Rows q8_0, q4_0, q4_1 are requantized from the Q4_1 file at load; \"as stored\" runs the file's own blocks.\n"
    echo
    echo "The default model run from its Q4_1 GGUF ($(printf %.1f "$(calc "$gguf_kib / 1024")") MiB; weights as stored, read in place from the"
    echo "mapping, W8A8 panels from qlm's cache; F16 decode caches), peak RSS by \`/usr/bin/time\`, the least of three runs,"
    echo "tokenizer, code and buffers included:"
    echo
    echo "| job | peak RSS MiB | x the file |"
    echo "| --- | ---: | ---: |"
    for job in "generate|\`qlm generate -p Hello -n 1\`" "summarize|\`qlm summarize\` of README.md's dialogue"; do
        rss=$(cat "$tmp/rss-${job%%|*}")
        printf "| %s | %.1f | %.2f |\n" "${job#*|}" "$(calc "$rss / 1024")" "$(calc "$rss / $gguf_kib")"
    done
    if [ "${#llama_pairs[@]}" -gt 0 ]; then
        echo
        echo "## qlm and llama.cpp on the same GGUF files"
        echo
        echo "llama.cpp's \`llama-bench\` ($(basename "$llama_bench"), built outside the repository from the vendored sources"
        echo "of the llama-cpp-python sdist) and \`qlm bench\` (each tensor as stored) on the default model's Q4_1 file and"
        echo "its Q8_0 and Q4_0 requantizations by llama-quantize, $threads threads, $reps repetitions, same run; qlm"
        echo "with 16-bit x (\`--no-w8a8\`) and with W8A8 (x in 8-bit blocks, as llama.cpp multiplies these types; qlm's"
        echo "default on CPUs with AVX2 or AVX-512). Peak RSS: \`/usr/bin/time\` of the whole llama-bench run; qlm's"
        echo "own measurement (16-bit x)."
        echo
        echo "| GGUF type | llama.cpp pp512 | qlm --no-w8a8 pp512 | qlm W8A8 pp512 | llama.cpp tg128 | qlm --no-w8a8 tg128 | qlm W8A8 tg128 | llama.cpp RSS MiB | qlm RSS MiB |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for t in "${llama_pairs[@]}"; do
            lpp=$(llama_ts "$tmp/llama-$t.json" 512 0); ltg=$(llama_ts "$tmp/llama-$t.json" 0 128)
            q="$tmp/qlm-$t.json"; q8="$tmp/qlm-w8a8-$t.json"
            printf "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f |\n" "$t" "$lpp" "$(json_field "$q" pp_tps)" \
                "$(json_field "$q8" pp_tps)" "$ltg" "$(json_field "$q" tg_tps)" "$(json_field "$q8" tg_tps)" \
                "$(calc "$(cat "$tmp/llama-$t.rss") / 1024")" "$(json_field "$q" peak_rss_mib)"
        done
    fi
    echo
    echo "## W8A8 per kernel set"
    echo
    echo "The default model requantized to Q4_0 at load, under each kernel set this CPU runs (\`QLM_ISA=...\`; without"
    echo "it qlm takes the last), with 16-bit x (\`--no-w8a8\`) and with W8A8, $threads threads, $reps repetitions,"
    echo "same run: what a CPU with only AVX2, with AVX-VNNI (Alder Lake and later client CPUs) or with AVX-512"
    echo "before VNNI gets. W8A8's integer sums are exact on every set, so the results are the same bit for bit."
    echo
    echo "| kernels | --no-w8a8 pp512 | W8A8 pp512 | ratio | --no-w8a8 tg128 | W8A8 tg128 | ratio |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    for isa in "${isa_rows[@]}"; do
        a="$tmp/isa-$isa--no-w8a8.json"; b="$tmp/isa-$isa--w8a8.json"
        printf "| %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx |\n" "$isa" "$(json_field "$a" pp_tps)" \
            "$(json_field "$b" pp_tps)" "$(calc "$(json_field "$b" pp_tps) / $(json_field "$a" pp_tps)")" \
            "$(json_field "$a" tg_tps)" "$(json_field "$b" tg_tps)" \
            "$(calc "$(json_field "$b" tg_tps) / $(json_field "$a" tg_tps)")"
    done
    echo
    avx2_section
    echo
    llama_1b_section
    echo
    echo "## Batch summarization"
    echo
    echo "\`qlm summarize --batch\` over the first $n_dialogues DialogSum test dialogues (zero-shot prompt; chat template for"
    echo "SmolLM2, plain for T5), greedy, at most $summary_tokens new tokens each, BF16 weights, $threads threads, in the same run; each"
    echo "batch size's fastest of $summary_reps interleaved rounds. Each dialogue's prompt (T5: its encoder pass) is"
    echo "evaluated once, less the prefix it shares with an earlier prompt (SmolLM2's chat template and instruction),"
    echo "whose keys and values are copied; a prompt that fits joins a decode step, and decode steps are shared by"
    echo "the batch."
    echo
    echo "| model | batch size | seconds | dialogues/s | generated tok/s | prompt tokens reused | vs batch 1 |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    base=""
    for r in "${summary_rows[@]}"; do
        IFS='|' read -r name bs secs dps tps reused <<< "$r"
        [ "$bs" = 1 ] && base=$dps
        printf "| %s | %s | %.1f | %.3f | %.1f | %s | %.2fx |\n" "$name" "$bs" "$secs" "$dps" "$tps" "$reused" \
            "$(calc "$dps / $base")"
    done
    echo
    ct2_section
    echo
    echo "## LoRA adapters, unmerged"
    echo
    echo "Decode of SmolLM2-135M-Instruct (BF16) with rank-16 adapters on q/k/v/o_proj of every layer, applied"
    echo "unmerged per row (build/bench/bench_lora, same run; 96 decode steps after a 32-token prompt, best of"
    echo "three interleaved rounds)."
    echo
    echo "$lora_table"
    echo
    echo "## HTTP server"
    echo
    echo "\`qlm serve\` on SmolLM2-135M-Instruct (BF16, --max-seqs 16, $threads threads, same run), loaded by build/bench/bench_serve:"
    echo "C concurrent clients send streaming requests (\"Request i. Write a short story about ...\", 16 different"
    echo "prompts in turn, greedy, max_tokens 64) back to back, max(16, 8C) requests per row. Workload chat: through"
    echo "/v1/chat/completions and the model's chat template, as an instruction-tuned model is used; its answers run"
    echo "to max_tokens. Workload completions: the same words as a raw /v1/completions prompt, which this model"
    echo "mostly ends after a few tokens, so that load is mostly prompts and request turnover. Aggregate tok/s:"
    echo "completion tokens (from the usage of each stream) over the row's wall time; TTFT: from connecting to the"
    echo "first streamed token. Target: 16 clients ≥ 4x the tokens/s of one, TTFT p99 under 2 s."
    echo
    echo "$serve_table"
    echo "$serve_table_raw"
    echo
    chat16=$(awk -F'|' '$2 ~ /chat/ && $3 + 0 == 16 { print $4 + 0 }' <<< "$serve_table")
    bf16_pp=$(json_field "$tmp/bf16.json" pp_tps)
    echo "One client decodes at the memory's pace (every BF16 weight read for each token); sixteen share each"
    echo "step's reads, and their products are then bound by arithmetic, whose rate here BF16's pp512 above"
    printf 'measures: chat with 16 clients completes %.1f tok/s, %.0f%% of it (prompts and attention on top).\n' \
        "$chat16" "$(calc "100 * $chat16 / $bf16_pp")"
    echo
    echo "## LoRA training"
    echo
    echo "\`qlm train --lora\` (rank 16, alpha 32, all linear layers, dropout 0.05, AdamW, F32, batch 4, $train_steps steps) on"
    echo "the first $((train_steps * 4)) DialogSum training dialogues with the lab's prompt (loss on the summary), $threads threads;"
    echo "transformers + peft with the same settings on the same token sequences in the same run (padded batches, its"
    echo "default attention). Tokens: prompt + summary + EOS of every example."
    echo
    echo "| trainer | tokens | tokens/s | peak RSS MiB |"
    echo "| --- | ---: | ---: | ---: |"
    printf "| qlm | %.0f | %.1f | %.0f |\n" "$train_qlm_tokens" "$train_qlm_tps" "$train_qlm_rss"
    if [ -n "$train_peft" ]; then
        read -r peft_tps peft_rss peft_tokens _ <<< "$train_peft"
        printf "| transformers + peft | %s | %s | %s |\n" "$peft_tokens" "$peft_tps" "$peft_rss"
        echo
        printf -- "- qlm / peft: **%.2fx** the tokens/s at **%.2fx** the peak memory.\n" \
            "$(calc "$train_qlm_tps / $peft_tps")" "$(calc "$train_qlm_rss / $peft_rss")"
    else
        echo
        echo "(transformers + peft not importable by $bench_python: set QLM_BENCH_PYTHON to a Python that has them.)"
    fi
    echo
    echo "Reproduce: \`make bench\` (QLM_BENCH_REPS, QLM_BENCH_DIALOGUES, QLM_BENCH_SUMMARY_TOKENS and"
    echo "QLM_BENCH_SUMMARY_REPS change the repetitions, the number of dialogues, the summary length and the"
    echo "summarization rounds; QLM_BENCH_1B_REPS the repetitions of the TinyLlama-1.1B-shaped section)."
    # Every block another script writes (make eval, train-eval, qat-eval, int4-eval, w8a8-eval,
    # scripts/bench_gpu.sh, scripts/bench_dist.sh: <!-- name --> ... <!-- /name -->) is kept.
    if [ -f "$out" ]; then
        awk '!keep && /^<!-- [a-z0-9-]+ -->$/ { keep = 1; print "" } keep { print }
             keep && /^<!-- \/[a-z0-9-]+ -->$/ { keep = 0 }' "$out"
    fi
} > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
