# shellcheck shell=bash
# Sourced (from the repository root) by the scripts that record results in docs/benchmarks.md
# (eval_dialogsum.sh, train_dialogsum.sh, qat_eval.sh): the default model ($model, $cache), the
# assets folder, and doc_block.
. scripts/default_model.sh
assets="${QLM_ASSETS:-../shared/assets}"

. scripts/doc_block.sh
