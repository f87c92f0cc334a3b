#!/usr/bin/env python3
"""Dev-time check that tokenizer folders written by qlm_tokenizer_save_json load in the Python
libraries and reproduce the reference fixtures.

    QLM_EXPORT_DIR=/tmp/qlm_tok_export ./build/tests/test_tokenizer_export
    python3 tools/check_tokenizer_export.py /tmp/qlm_tok_export

Every sub-folder named like a fixture in tests/fixtures/tokenizer/ (stories260k, llama2, tinyllama,
tinyllama_ms_*, tinystories656k, smollm2, smollm2_pre_*) is loaded with
tokenizers.Tokenizer.from_file and with transformers' AutoTokenizer, and each record of the fixture
is compared:
  ids   encode(text, add_special_tokens=True), special tokens parsed (HF fixtures only)
  raw   encode(text, add_special_tokens=False), special tokens not parsed
  dec   decode(ids, skip_special_tokens=True) (for sentencepiece fixtures: decode(raw))
The BOS/EOS framing is compared separately: the export may frame differently from the fixture
(test_tokenizer_export.c turns BOS/EOS on for two byte-level variants), so ids are compared with
each side's own framing removed, and the framing against the folder's tokenizer_config.json.
Prints the mismatch counts; exits 1 if any.
"""
import json
import os
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def load_fixture(name):
    with open(os.path.join(FIX, name + ".jsonl"), encoding="utf-8") as f:
        meta = json.loads(f.readline())["meta"]
        return meta, [json.loads(line) for line in f]


def corpus_lines():
    with open(os.path.join(FIX, "corpus.txt"), encoding="utf-8", newline="") as f:
        return f.read().split("\n")[:-1]


class Tok:
    """tokenizers.Tokenizer and transformers' tokenizer behind one interface."""

    def __init__(self, kind, folder):
        self.kind = kind
        if kind == "tokenizers":
            self.t = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        else:
            self.t = AutoTokenizer.from_pretrained(folder)

    def encode(self, text, add_special, parse_special):
        if self.kind == "tokenizers":
            self.t.encode_special_tokens = not parse_special
            ids = self.t.encode(text, add_special_tokens=add_special).ids
            self.t.encode_special_tokens = False
            return ids
        return self.t(text, add_special_tokens=add_special, split_special_tokens=not parse_special)["input_ids"]

    def decode(self, ids, skip_special):
        return self.t.decode(ids, skip_special_tokens=skip_special)

    def special_ids(self):
        if self.kind == "tokenizers":
            return {i for i, a in self.t.get_added_tokens_decoder().items() if a.special}
        return set(self.t.all_special_ids)


def unframe(ids, bos, eos):
    a, b = (1 if bos else 0), len(ids) - (1 if eos else 0)
    return ids[a:b]


def check(folder, name, kind, lines):
    meta, records = load_fixture(name)
    cfg = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    tok = Tok(kind, folder)
    bos = tok.t.token_to_id(cfg["bos_token"]) if kind == "tokenizers" and cfg.get("bos_token") else None
    if kind != "tokenizers" and cfg.get("bos_token"):
        bos = tok.t.convert_tokens_to_ids(cfg["bos_token"])
    eos_tok = cfg.get("eos_token")
    eos = None
    if eos_tok:
        eos = tok.t.token_to_id(eos_tok) if kind == "tokenizers" else tok.t.convert_tokens_to_ids(eos_tok)
    add_bos, add_eos = cfg.get("add_bos_token", False), cfg.get("add_eos_token", False)
    special = tok.special_ids()
    bad = {"ids": 0, "raw": 0, "dec": 0, "framing": 0}
    shown = 0
    for r in records:
        n = r.get("n", 1)
        text = "\n".join(lines[r["i"]:r["i"] + n])
        raw = tok.encode(text, False, False)
        want_raw = r.get("raw")
        if want_raw is None:
            want_raw = unframe(r["ids"], meta["add_bos"], meta["add_eos"])
        if raw != want_raw:
            bad["raw"] += 1
            if shown < 3:
                print(f"  {kind} record {r['i']}+{n} raw: {raw[:20]} want {want_raw[:20]} text={text[:60]!r}")
                shown += 1
        framed = tok.encode(text, True, True)
        if (add_bos and framed[:1] != [bos]) or (add_eos and framed[-1:] != [eos]):
            bad["framing"] += 1
        if "ids" in r:
            got = unframe(framed, add_bos, add_eos)
            if got != unframe(r["ids"], meta["add_bos"], meta["add_eos"]):
                bad["ids"] += 1
                if shown < 3:
                    print(f"  {kind} record {r['i']}+{n} ids: {got[:20]} want {r['ids'][:20]} text={text[:60]!r}")
                    shown += 1
            ids = r["ids"]
        else:
            ids = r["raw"]
        if "ids" in r and not meta.get("decs", True):
            # the fixture's convention for normalized special tokens (see make_tokenizer_fixtures.HF)
            dec = tok.decode([i for i in ids if i not in special], False)
        else:
            dec = tok.decode(ids, True)
        if dec != r.get("dec", text):
            bad["dec"] += 1
    return len(records), bad


def main():
    export = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QLM_EXPORT_DIR", "/tmp/qlm_tok_export")
    lines = corpus_lines()
    total = 0
    names = sorted(d for d in os.listdir(export) if os.path.exists(os.path.join(FIX, d + ".jsonl")))
    if not names:
        sys.exit(f"{export}: no folders named like a fixture in {FIX}")
    for name in names:
        folder = os.path.join(export, name)
        for kind in ("tokenizers", "transformers"):
            n, bad = check(folder, name, kind, lines)
            total += sum(bad.values())
            counts = ", ".join(f"{k} {v}" for k, v in bad.items())
            print(f"{name:22s} {kind:12s} {n} records; mismatches: {counts}")
        cfg = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
        if cfg.get("chat_template"):
            tmpl = AutoTokenizer.from_pretrained(folder).chat_template
            if tmpl != cfg["chat_template"]:
                print(f"{name}: transformers' chat_template differs from tokenizer_config.json")
                total += 1
    print("all match" if total == 0 else f"{total} mismatches")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
