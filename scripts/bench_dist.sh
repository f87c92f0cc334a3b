#!/usr/bin/env bash
# `make bench` (after scripts/bench.sh), or alone as `make bench-dist`: qlm as several processes
# under mpirun on this machine, written to the <!-- dist --> block of docs/benchmarks.md:
#   - per-rank memory of full F32 training of a model of SmolLM2-135M's exact config (random
#     weights) and of LoRA on its BF16 base, for each strategy at 1, 2 and 4 ranks: the engine's
#     own accounting, the peak RSS of the steps, and the ZeRO paper's formulas;
#   - FSDP's overlap: step time and the passes' wait for gathers with --prefetch 1 and 0;
#   - equivalence on that model: ten AdamW steps under each strategy against one process;
#   - sharded inference of the real SmolLM2-135M-Instruct: greedy output and per-rank weights.
# The ranks share this machine's cores (mpirun --oversubscribe), so the times say what the
# communication costs here, not what separate machines would do.
set -euo pipefail
qlm=${1:-build/qlm}
cd "$(dirname "$0")/.."
. scripts/default_model.sh
. scripts/doc_block.sh
assets="${QLM_ASSETS:-../shared/assets}"
steps=${QLM_BENCH_DIST_STEPS:-10}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe --mca btl self,vader)
diff_tool="$(dirname "$qlm")/bench/weights_diff"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

calc() { awk "BEGIN { printf \"%.6f\", ($1) }"; }
# A field of rank 0's entry of summary.json's dist.per_rank, or a top-level field.
rank_field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dist']['per_rank'][0][sys.argv[2]])" "$1" "$2"; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# The model of SmolLM2-135M's config: its config.json beside random weights; the tokenizer of the GGUF.
mkdir -p "$tmp/smollm2"
cp "$model/config.json" "$tmp/smollm2/"
head -n 64 "$assets/dialogsum/dialogsum.train.from_zip_2021-05.jsonl" > "$tmp/data.jsonl"
train_args=(-m "$tmp/smollm2" --random-weights -t "$gguf" --data "$tmp/data.jsonl" --target-field summary
            --seq-len 64 --save-every 1000 --lr 1e-4)

# run NAME RANKS SPLIT MODE STEPS: trains into $tmp/NAME with a global batch of 4 sequences.
run() {
    local name=$1 np=$2 split=$3 mode=$4 n=$5
    echo "bench-dist: $name ($np ranks $split $mode) ..." >&2
    if [ "$np" = 0 ]; then
        "$qlm" train "${train_args[@]}" $mode --steps "$n" --batch 4 --out "$tmp/$name" 2> "$tmp/$name.log" > /dev/null
    else
        "${mpirun[@]}" -np "$np" "$qlm" train "${train_args[@]}" $mode --steps "$n" --batch $((4 / np)) $split \
            --out "$tmp/$name" > "$tmp/$name.log" 2>&1
    fi || { tail -20 "$tmp/$name.log" >&2; exit 1; }
}

mib() { calc "$1 / 1048576"; }

# ---- memory ----
memory_rows=()
for mode in "--full" "--lora --rank 16 --base-dtype bf16"; do
    for spec in "1|none" "2|ddp" "4|ddp" "2|zero1" "4|zero1" "2|zero2" "4|zero2" "2|fsdp" "4|fsdp"; do
        IFS='|' read -r np shard <<< "$spec"
        name="mem-$(tr -dc a-z <<< "$mode")-$shard-$np"
        if [ "$shard" = none ]; then run "$name" 0 "" "$mode" 2; else run "$name" "$np" "--shard $shard" "$mode" 2; fi
        s="$tmp/$name/summary.json"
        memory_rows+=("$mode|$shard|$np|$(rank_field "$s" params_bytes)|$(rank_field "$s" grads_bytes)|$(rank_field "$s" optim_bytes)|$(rank_field "$s" transient_peak_bytes)|$(rank_field "$s" train_peak_rss_mib)")
        rm -rf "$tmp/$name/model" "$tmp/$name/adapter" "$tmp/$name"/checkpoint-*
    done
done

# ---- overlap ----
# Interleaved rounds, each setting's fastest kept: the step time of this VM moves by 20% from run to run.
overlap_rounds=${QLM_BENCH_DIST_ROUNDS:-3}
declare -A fastest=()
for _ in $(seq "$overlap_rounds"); do
    for k in 1 0; do
        run "overlap-$k" 2 "--shard fsdp --prefetch $k" "--full" 4
        s="$tmp/overlap-$k/summary.json"
        row="$(calc "$(field "$s" train_seconds) / 4")|$(calc "$(rank_field "$s" gather_wait_seconds) / 4")|$(rank_field "$s" gathers)"
        if [ -z "${fastest[$k]:-}" ] || [ "$(calc "${row%%|*} < ${fastest[$k]%%|*}")" = 1.000000 ]; then fastest[$k]=$row; fi
        rm -rf "$tmp/overlap-$k"
    done
done
overlap_rows=("1|${fastest[1]}" "0|${fastest[0]}")

# ---- equivalence ----
losses() { python3 -c "import json,sys; print(' '.join('%.7f' % json.loads(l)['loss'] for l in open(sys.argv[1])))" "$1"; }
equiv_rows=()
for mode in "--full" "--lora --rank 16"; do
    tag=$(tr -dc a-z <<< "$mode")
    run "ref-$tag" 0 "" "$mode" "$steps"
    weights=model/model.safetensors
    [ "$tag" = full ] || weights=adapter/adapter_model.safetensors
    for spec in "2|--shard ddp" "4|--shard zero1" "4|--shard zero2" "4|--shard fsdp" "4|--shard fsdp --sharding-factor 2"; do
        IFS='|' read -r np split <<< "$spec"
        name="eq-$tag-$np-$(tr -dc a-z0-9 <<< "$split")"
        run "$name" "$np" "$split" "$mode" "$steps"
        loss_diff=$(paste <(losses "$tmp/ref-$tag/metrics.jsonl" | tr ' ' '\n') <(losses "$tmp/$name/metrics.jsonl" | tr ' ' '\n') |
                    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.2g", m }')
        read -r wdiff _ _ <<< "$("$diff_tool" "$tmp/ref-$tag/$weights" "$tmp/$name/$weights")"
        equiv_rows+=("$mode|$np|$split|$loss_diff|$wdiff")
    done
    # The same setting twice: the same bits.
    run "again-$tag" 4 "--shard fsdp" "$mode" "$steps"
    read -r _ _ rerun <<< "$("$diff_tool" "$tmp/eq-$tag-4-shardfsdp/$weights" "$tmp/again-$tag/$weights")"
    equiv_rows+=("$mode|4|--shard fsdp, run again|rerun|$rerun")
done

# ---- sharded inference ----
head -n 32 "$assets/dialogsum/dialogsum.test.jsonl" > "$tmp/dialogues.jsonl"
infer_rows=()
for np in 1 2 4; do
    echo "bench-dist: sharded inference, $np ranks ..." >&2
    args=(-m "$gguf" --dtype bf16 --device cpu)
    if [ "$np" = 1 ]; then
        "$qlm" generate "${args[@]}" -p 'The three primary colors are' -n 32 --temp 0 --json --quiet > "$tmp/gen-1.json"
        start=$(date +%s.%N)
        "$qlm" summarize "${args[@]}" --batch "$tmp/dialogues.jsonl" --out "$tmp/sum-1.jsonl" -n 32 --batch-size 8 \
            --no-prefix-reuse --quiet
        secs=$(calc "$(date +%s.%N) - $start")
        kept=$(calc "$(stat -c %s "$model/model.safetensors") / 1048576")
    else
        "${mpirun[@]}" -np "$np" "$qlm" generate "${args[@]}" --shard fsdp -p 'The three primary colors are' -n 32 \
            --temp 0 --json --quiet > "$tmp/gen-$np.json"
        start=$(date +%s.%N)
        "${mpirun[@]}" -np "$np" "$qlm" summarize "${args[@]}" --shard fsdp --batch "$tmp/dialogues.jsonl" \
            --out "$tmp/sum-$np.jsonl" -n 32 --batch-size 8 --no-prefix-reuse > "$tmp/sum-$np.log" 2>&1
        secs=$(calc "$(date +%s.%N) - $start")
        kept=$(sed -n 's/.*rank 0 keeps \([0-9.]*\) of.*/\1/p' "$tmp/sum-$np.log")
    fi
    gen_same=$(cmp -s "$tmp/gen-1.json" "$tmp/gen-$np.json" && echo identical || echo different)
    sum_same=$(cmp -s "$tmp/sum-1.jsonl" "$tmp/sum-$np.jsonl" && echo identical || echo different)
    infer_rows+=("$np|$gen_same|$sum_same|$secs|$kept")
done

block="$tmp/block.md"
{
    echo "<!-- dist -->"
    echo "## Distributed training and sharded inference"
    echo
    echo "Written by \`make bench\` (scripts/bench_dist.sh) on $(date -u +%Y-%m-%d): mpirun with up to 4 ranks on this"
    echo "$(nproc)-core machine (--oversubscribe: the ranks share the cores, so times show what the communication costs"
    echo "here, not what separate machines would do). Model: SmolLM2-135M-Instruct's exact config with random weights"
    echo "(Ψ = 134.5M parameters), sequences of up to 64 tokens from DialogSum, a global batch of 4 sequences."
    echo
    echo "### Memory per rank"
    echo
    echo "Bytes rank 0 holds, by the engine's own accounting: parameters (what the passes read), gradients, optimizer"
    echo "state (AdamW moments; and the F32 master when it is not what the passes read), and the peak of the whole-unit"
    echo "buffers a sharded run allocates for gathers and gradient reduce-scatters; with the ZeRO paper's formula for"
    echo "the persistent state (F32 training: 4Ψ parameters, 4Ψ gradients, 8Ψ moments; N ranks), and the peak RSS of"
    echo "the training steps (after set-up, VmHWM reset). Full training, F32:"
    echo
    echo "| strategy | ranks | params MiB | grads MiB | optimizer MiB | total MiB | ZeRO formula MiB | vs 1 process | transient peak MiB | step peak RSS MiB |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    single="" p1=""
    for r in "${memory_rows[@]}"; do
        IFS='|' read -r mode shard np p g o tr rss <<< "$r"
        [ "$mode" = "--full" ] || continue
        total=$(calc "$p + $g + $o")
        [ -n "$single" ] || single=$total p1=$p
        # P = 4Ψ bytes, the single process's parameters.
        case "$shard" in
            none | ddp) formula=$(mib "4 * $p1") ;;
            zero1) formula=$(mib "(2 + 2 / $np) * $p1") ;;
            zero2) formula=$(mib "(1 + 3 / $np) * $p1") ;;
            fsdp) formula=$(mib "4 / $np * $p1") ;;
        esac
        printf "| %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2fx | %.0f | %.0f |\n" "$shard" "$np" "$(mib "$p")" \
            "$(mib "$g")" "$(mib "$o")" "$(mib "$total")" "$formula" "$(calc "$total / $single")" "$(mib "$tr")" "$rss"
    done
    echo
    last=""
    for r in "${memory_rows[@]}"; do
        IFS='|' read -r mode shard np p g o tr rss <<< "$r"
        [ "$mode" = "--full" ] && [ "$shard" = fsdp ] && [ "$np" = 4 ] && last="$p|$g|$o|$tr|$rss"
    done
    IFS='|' read -r p g o tr rss <<< "$last"
    IFS='|' read -r _ _ _ _ _ _ _ rss1 <<< "${memory_rows[0]}"
    printf -- "- FSDP at 4 ranks: **%.2fx** one process's persistent model state; **%.2fx** with its transient whole-unit\n" \
        "$(calc "($p + $g + $o) / $single")" "$(calc "($p + $g + $o + $tr) / $single")"
    printf "  buffers (the largest unit, the 113 MiB embedding that is also the head, gathered whole with its\n"
    printf "  gradient); the steps' peak RSS **%.2fx** one process's (activations and code included).\n" "$(calc "$rss / $rss1")"
    echo
    echo "LoRA (rank 16, all linear layers) on the BF16 base: the base is split under FSDP (parameters), the adapter"
    echo "stays whole on every rank and its moments are split from ZeRO-1 on."
    echo
    echo "| strategy | ranks | params MiB (base + adapter) | grads MiB | optimizer MiB | transient peak MiB | step peak RSS MiB |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    for r in "${memory_rows[@]}"; do
        IFS='|' read -r mode shard np p g o tr rss <<< "$r"
        [ "$mode" != "--full" ] || continue
        printf "| %s | %s | %.1f | %.2f | %.2f | %.0f | %.0f |\n" "$shard" "$np" "$(mib "$p")" "$(mib "$g")" "$(mib "$o")" \
            "$(mib "$tr")" "$rss"
    done
    echo
    echo "### FSDP overlap"
    echo
    echo "Two ranks, full training, 4 steps: with --prefetch 1 the next unit's all-gather runs while the current one"
    echo "computes; with 0 every gather starts when its unit is needed. The wait is the time the passes spent"
    echo "blocked on gathers (timers around each unit's use). Each setting's fastest of $overlap_rounds interleaved runs."
    echo
    echo "| prefetch | s/step | gather wait s/step | gathers |"
    echo "| ---: | ---: | ---: | ---: |"
    for r in "${overlap_rows[@]}"; do
        IFS='|' read -r k sps wps n <<< "$r"
        printf "| %s | %.2f | %.3f | %s |\n" "$k" "$sps" "$wps" "$n"
    done
    IFS='|' read -r _ _ w1 _ <<< "${overlap_rows[0]}"
    IFS='|' read -r _ _ w0 _ <<< "${overlap_rows[1]}"
    printf "\nShare of the gather time hidden by prefetching: **%.0f%%** (1 - wait with prefetch / wait without).\n" \
        "$(calc "100 * (1 - $w1 / $w0)")"
    echo "Here every core already computes (two ranks, one thread each, on $(nproc) cores): the transfers' copies and"
    echo "their progress thread take the same cores whether they overlap the compute or not, so the step time does"
    echo "not follow the wait (it moves by 20% between runs of one setting on this VM); communication with resources"
    echo "of its own (spare cores, a GPU's copy engines and NVLink) is what prefetching hides."
    echo
    echo "### Equivalence with one process"
    echo
    echo "$steps AdamW steps (lr 1e-4) of each split against one process over the same global batch: the largest"
    echo "difference of any step's loss (nats) and of the final weights (relative to each tensor's largest value);"
    echo "the rerun of a setting must be bit-identical."
    echo
    echo "| training | ranks | split | max loss diff | max weight diff |"
    echo "| --- | ---: | --- | ---: | ---: |"
    for r in "${equiv_rows[@]}"; do
        IFS='|' read -r mode np split ld wd <<< "$r"
        printf "| %s | %s | %s | %s | %s |\n" "$mode" "$np" "$split" "$ld" "$wd"
    done
    echo
    echo "### Sharded inference"
    echo
    echo "SmolLM2-135M-Instruct (BF16), --shard fsdp: greedy \`qlm generate\` (32 tokens) and \`qlm summarize --batch\`"
    echo "of 32 DialogSum test dialogues (32 tokens each, batch 8, --no-prefix-reuse, split over the ranks) against"
    echo "one process, and the weights rank 0 keeps."
    echo
    echo "| ranks | generate | summarize | summarize s | weights rank 0 keeps MiB |"
    echo "| ---: | --- | --- | ---: | ---: |"
    for r in "${infer_rows[@]}"; do
        IFS='|' read -r np g s secs kept <<< "$r"
        printf "| %s | %s | %s | %.1f | %.1f |\n" "$np" "$g" "$s" "$secs" "$kept"
    done
    echo
    echo "Reproduce: \`make bench-dist\` (QLM_BENCH_DIST_STEPS sets the equivalence steps)."
    echo "<!-- /dist -->"
} > "$block"
doc_block dist "$block"
cat "$block"
