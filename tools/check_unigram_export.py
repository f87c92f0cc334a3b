#!/usr/bin/env python3
"""Dev-time check that the Unigram tokenizer.json files qlm_tokenizer_save_json writes load in HF
tokenizers and give the reference ids.

    QLM_EXPORT_DIR=/tmp/qlm_uni_export ./build/tests/test_unigram
    python3 tools/check_unigram_export.py /tmp/qlm_uni_export

t5_json/    written from flan-t5-small/tokenizer.json: every record of
            tests/fixtures/unigram/tokenizers.jsonl must match ("ids" with special tokens parsed and
            </s> appended, "raw" without either, "dec", "decs").
t5_spiece/  written from spiece.model (32000 pieces, no <extra_id_N>): written as transformers'
            converter would, so its ids must equal tokenizers.jsonl on every text without
            "<extra_id_" (whose ids that vocabulary lacks).
Prints the mismatch counts; exits 1 if any.
"""
import json
import os
import sys

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "unigram")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(os.path.join(FIX, "corpus.txt"), encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")[:-1]
    with open(os.path.join(FIX, "tokenizers.jsonl"), encoding="utf-8") as f:
        f.readline()
        recs = [json.loads(line) for line in f]
    bad = 0
    for name, full in (("t5_json", True), ("t5_spiece", False)):
        tok = Tokenizer.from_file(os.path.join(sys.argv[1], name, "tokenizer.json"))
        checked = mismatches = 0
        for r in recs:
            text = "\n".join(lines[r["i"]:r["i"] + r.get("n", 1)])
            if not full and "<extra_id_" in text:
                continue
            checked += 1
            tok.encode_special_tokens = False
            ids = tok.encode(text).ids
            tok.encode_special_tokens = True
            raw = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            ok = ids == r["ids"] and raw == r.get("raw", r["ids"][:-1])
            if full:
                ok = ok and tok.decode(ids) == r.get("dec", text)
                ok = ok and tok.decode(ids, skip_special_tokens=False) == r.get("decs", text)
            if not ok:
                mismatches += 1
                if mismatches <= 5:
                    print(f"{name}: record {r['i']}/{r.get('n', 1)} {text[:60]!r}: {ids[:20]} vs {r['ids'][:20]}")
        print(f"{name}: {checked} texts, {mismatches} mismatches")
        bad += mismatches
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
