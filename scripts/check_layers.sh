#!/usr/bin/env bash
# The include check of the layers (docs/ARCHITECTURE.md, "Layers"): lists every include that crosses
# from one source folder into another and fails on one that points a forbidden way. Each folder may
# include only itself and the folders after its name below; tests/, bench/, fuzz/ and tools/ may
# include anything. Run from the repository root; make test runs it, and runs it once more with
# --extra FILE:INCLUDE, which checks one more include as if FILE had it (make test adds a reversed
# arrow that way and expects the check to fail). It prints each allowed arrow with its includes'
# count; -v prints every cross-folder include, -q only violations.
set -u
declare -A ALLOWED=(
    [core]=""
    [quant]="core"
    [tokenizer]="core"
    [cpu]="core quant"
    [models]="core quant"
    [loaders]="core quant models tokenizer hub"
    [lora]="core quant models loaders"
    [runtime]="core models tokenizer"
    [eval]="core tokenizer"
    [hub]="core"
    [dist]="core models"
    [cuda]="core quant dist"
    [train]="core quant models loaders lora runtime tokenizer dist"
    [server]="core models loaders lora runtime tokenizer hub eval"
    [cli]="core quant tokenizer cpu models loaders lora runtime eval hub dist train server cuda"
)
quiet=0 verbose=0 extra=()
while [ $# -gt 0 ]; do
    case $1 in
    -q) quiet=1 ;;
    -v) verbose=1 ;;
    --extra) extra+=("$2"); shift ;;
    *) echo "usage: scripts/check_layers.sh [-q|-v] [--extra FILE:INCLUDE]..." >&2; exit 2 ;;
    esac
    shift
done
bad=0 crossings=0
declare -A pairs=()

# check FILE INCLUDE: the include as written in FILE (relative to FILE's folder)
check() {
    local file=$1 inc=$2 from=${1%%/*} target to
    if [ -z "${ALLOWED[$from]+x}" ]; then
        echo "check_layers: $file is in a folder with no rule ($from/)"
        bad=1
        return
    fi
    target=$(realpath -m --relative-to=. "$(dirname "$file")/$inc")
    to=${target%%/*}
    [ "$to" = "$from" ] && return
    crossings=$((crossings + 1))
    if [[ " ${ALLOWED[$from]} " != *" $to "* ]]; then
        echo "check_layers: $file includes $inc: $from/ may not include $to/"
        bad=1
    else
        pairs[$from -\> $to]=$((${pairs[$from -\> $to]:-0} + 1))
        [ "$verbose" -eq 1 ] && echo "  $file -> $target"
    fi
}

while IFS= read -r file; do
    while IFS= read -r inc; do check "$file" "$inc"; done \
        < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(git ls-files -co --exclude-standard '*.c' '*.h' '*.cu' | grep -v '^\(tests\|bench\|fuzz\|tools\)/')
for e in "${extra[@]+"${extra[@]}"}"; do check "${e%%:*}" "${e#*:}"; done
if [ "$quiet" -eq 0 ]; then
    for p in "${!pairs[@]}"; do printf '  %-22s %3d\n' "$p" "${pairs[$p]}"; done | sort
fi
if [ "$bad" -ne 0 ]; then
    echo "check_layers: forbidden includes (see docs/ARCHITECTURE.md, Layers)"
    exit 1
fi
echo "check_layers: $crossings cross-folder includes, all in the allowed directions"
