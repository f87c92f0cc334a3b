# shellcheck shell=bash
# Sourced by the scripts that record results in docs/benchmarks.md.
# doc_block NAME FILE puts FILE's lines (which start with <!-- NAME --> and end with <!-- /NAME -->)
# in place of that block of docs/benchmarks.md, or at its end when the block is not there yet.
doc_block() {
    local name=$1 block=$2 doc=docs/benchmarks.md
    touch "$doc"
    awk -v block="$block" -v first="<!-- $name -->" -v last="<!-- /$name -->" '
        $0 == first { while ((getline l < block) > 0) print l; skip = 1; done = 1; next }
        $0 == last { skip = 0; next }
        !skip { print }
        END { if (!done) { print ""; while ((getline l < block) > 0) print l } }' "$doc" > "$doc.tmp"
    mv "$doc.tmp" "$doc"
}
