#!/usr/bin/env python3
"""Writes the T5 / FLAN-T5 Unigram tokenizer fixtures used by tests/test_unigram.c (dev-time only;
qlm itself never runs Python).

    pip install tokenizers sentencepiece protobuf
    python3 tools/make_unigram_fixtures.py [--assets ../shared/assets]

Reference files: <assets>/flan-t5-small/tokenizer.json (HF tokenizers) and spiece.model
(sentencepiece); flan-t5-base holds identical copies.

Outputs (under tests/fixtures/unigram/):
  corpus.txt      >= 1000 deterministic lines, none holding "\\n" ("\\r" may appear): DialogSum
                  dialogue turns and summaries, the tokenizer corpus of make_tokenizer_fixtures.py
                  (scripts, emoji, whitespace, special-token strings, numbers, code), and lines aimed
                  at T5's normalizer (decomposed accents, full-width forms, ligatures, compatibility
                  characters, zero-width and control characters, runs of spaces and tabs, the
                  <extra_id_N>, </s>, <pad>, <unk> strings, characters the vocabulary lacks).
  tokenizers.jsonl  line 1: {"meta": {...}}; then one record per text
                  {"i": first line, "n": line count (text = "\\n".join(lines[i:i+n]); omitted when 1),
                   "ids":  encode(text) (add_special_tokens=True: the template appends </s>; special
                           tokens in the text are parsed),
                   "raw":  encode(text, add_special_tokens=False) with encode_special_tokens=True
                           (special-token strings are plain text); omitted when it equals "ids"
                           without the final </s>,
                   "dec":  decode(ids) (skip_special_tokens=True), omitted when equal to the text,
                   "decs": decode(ids, skip_special_tokens=False), omitted when equal to the text}
  sentencepiece.jsonl  the same records from sentencepiece, which parses no special tokens:
                  {"i", "n", "ids": encode(text) (no </s>; the script asserts that
                           encode(text, add_eos=True) is these ids followed by 1),
                   "dec":  decode(ids without the unk id 2) (sentencepiece renders unk as " ⁇ ",
                           qlm's decode(skip_special=1) drops it), omitted when equal to the text}
  normalize.json  {"cases": [{"text", "tokenizers": tokenizer.normalizer.normalize_str(text),
                   "sentencepiece": SentencePieceProcessor.normalize(text)}]}
"""
import argparse
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "unigram")
sys.path.insert(0, os.path.join(ROOT, "tools"))

T5_LINES = [
    "Summarize the following dialogue: #Person1#: Hello, how are you?",
    "translate English to German: The house is wonderful.",
    "question: What is the capital of France? context: Paris is the capital of France.",
    "The <extra_id_0> walks in <extra_id_1> park",
    "<extra_id_0>", "<extra_id_99>", "<extra_id_100>", "<extra_id_0 >", "<extra_id_-1>",
    "</s>", "<pad>", "<unk>", "</s></s>", "a</s>b", "a </s> b", "x<pad>y", "<pad><unk></s>",
    "Hello</s>", "</s>Hello", "  </s>  ", "<extra_id_5><extra_id_6>", "<extra_id_12>text<extra_id_13>",
    # decomposed accents (combining marks): short clusters that start with a rule's key
    "A\u0302\u0300 e\u0301 o\u0308 n\u0303 c\u0327", "Vie\u0302\u0323t Nam, tie\u0302\u0301ng Vie\u0302\u0323t",
    "\u03b1\u0313\u0300 \u03b5\u0301 \u03c9\u0342", "a\u0308\u0304 u\u0308\u0301 i\u0307\u0301",
    "e\u0301\u0323 o\u0323\u0302 A\u030a\u0301", "Z\u0351\u036b\u0343a\u0310l\u0346g\u0352o",
    "\uff21\u0301 \ufb01\u0301 \u2160\u0301", "\t\u0301 \u0301start", " \u0308", "x\u00a8y \u00b4 \u02dc",
    # precomposed and compatibility forms that NFKC rewrites
    "café naïve résumé Ångström façade coöperate", "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ：ＡＢＣ１２３！？",
    "ﬁnance ﬂower ﬀ ﬃ ﬄ ﬅ ﬆ", "Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ ⅰ ⅻ", "① ② ⑳ ㉑ ⒜ ⓐ", "x² y³ ¹⁄₂ H₂O ½ ¾ ⅓",
    "™ ℠ © ® ℃ ℉ № ℡ ㎏ ㎞ ㏄", "µ Ω K Å ℮", "ǅ ǈ ǋ Ǳ ĳ Ŀ ŉ", "ｶﾀｶﾅ ﾊﾝｶｸ ｶﾞｷﾞ", "㍻ ㋿ ㌀ ㍱",
    "…‥ ‼ ⁇ ⁈ ⁉", "“quotes” ‘single’ „low“ «guillemets» ‹x›", "– — ― ‐ ‑ ‒ −", "𝐁𝐨𝐥𝐝 𝑰𝒕𝒂𝒍𝒊𝒄 𝔉𝔯𝔞𝔨 𝕯",
    "Ａ\u3000Ｂ\u3000\u3000Ｃ", "\u00a0non\u00a0breaking\u00a0\u00a0spaces\u00a0",
    "zero\u200bwidth\u200cjoin\u200dner\ufeffbom", "soft\u00adhyphen", "\u2581literal\u2581meta\u2581space",
    # whitespace runs, tabs, carriage returns, controls
    "   three leading", "trailing three   ", "  both  ", "a  b   c    d", "tab\tseparated\tvalues",
    "\t\ttabs first", "mixed \t \t whitespace", "cr\rin the middle", "crlf\r", "\r", "\x0b\x0c",
    "\x01\x02control\x03\x7f", "bell\x07 and escape\x1b[0m", "   ", "\t", " ",
    "\u2003em\u2002en\u2009thin\u200ahair\u3000ideographic", "\u2028line\u2029para\u0085nel",
    # digits and numbers
    "0123456789", "3.14159 2.71828 1,000,000 1e-10", "٠١٢٣٤٥٦٧٨٩ ०१२३ ๑๒๓", "１２３４５", "2024-06-01T12:30:00Z",
    # characters the vocabulary lacks (unknown runs)
    "中文字符串 日本語の文 한국어 문장", "😀😃😄 🦙🦙 👍🏽 👨‍👩‍👧‍👦", "𓀀𓁐𓂀 𐍈𐍉", "Ελληνικά και русский текст",
    "עברית العربية हिन्दी ไทย", "mixed 中 text 文 with 字 gaps", "x🙂y🙂z", "ᄀ\u1161 \u1100\u1161\u11a8 가각",
    "\ue000\uf8ff private use", "\u0600" "1 \u06dd" "2",
    # Latin languages T5 was trained on
    "Das Haus ist wunderbar. Übermäßig große Straße.", "La maison est merveilleuse. Où êtes-vous ?",
    "Casa este minunată. Ștefan și Țara Românească.", "¿Dónde está la biblioteca? ¡Señor!",
]


def dialogue_lines(assets):
    """Turns and summaries of the DialogSum test set, in file order."""
    path = os.path.join(assets, "dialogsum", "dialogsum.test.jsonl")
    turns, summaries = [], []
    with open(path, encoding="utf-8") as f:
        for row in map(json.loads, f):
            turns.extend(t for t in row["dialogue"].split("\n") if t)
            summaries.append(row["summary1"])
    return turns, summaries


def make_corpus(assets):
    from make_tokenizer_fixtures import make_corpus as tokenizer_corpus
    turns, summaries = dialogue_lines(assets)
    rng = random.Random(5)
    lines = list(T5_LINES)
    lines += turns[:500] + rng.sample(turns[500:], 150) + summaries[:80]
    lines += ["Summarize the following dialogue: " + t for t in turns[:20]]
    lines += tokenizer_corpus()
    for s in lines:
        assert "\n" not in s, s
    return lines


def records(lines):
    """(first line, count) of every text: each line, 60 groups of 2-5 lines, one ~10 kB block."""
    out = [(i, 1) for i in range(len(lines))]
    rng = random.Random(11)
    for _ in range(60):
        i = rng.randrange(len(lines) - 5)
        out.append((i, rng.randrange(2, 6)))
    n, size = 0, 0
    while size < 10000:
        size += len(lines[n].encode()) + 1
        n += 1
    out.append((0, n))
    return out


def hf_record(tok, text):
    tok.encode_special_tokens = False
    ids = tok.encode(text).ids
    tok.encode_special_tokens = True
    raw = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    assert ids[-1] == 1, text
    rec = {"ids": ids}
    if raw != ids[:-1]:
        rec["raw"] = raw
    dec = tok.decode(ids)
    decs = tok.decode(ids, skip_special_tokens=False)
    if dec != text:
        rec["dec"] = dec
    if decs != text:
        rec["decs"] = decs
    return rec


def sp_record(sp, text):
    ids = sp.encode(text)
    assert sp.encode(text, add_eos=True) == ids + [1], text
    rec = {"ids": ids}
    dec = sp.decode([i for i in ids if i != sp.unk_id()])
    if dec != text:
        rec["dec"] = dec
    return rec


def write_jsonl(path, meta, make, lines, recs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for i, n in recs:
            rec = {"i": i}
            if n != 1:
                rec["n"] = n
            rec.update(make("\n".join(lines[i:i + n])))
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


NORMALIZE_CASES = [
    "", " ", "   ", "plain ascii", "  lead and trail  ", "a  b\t\tc\n\nd", "\r\n", "\r\nx",
    "A\u0302\u0300", "A\u0302\u0300x", "\u03b1\u0313\u0300", "e\u0301", "\uff21\u0301b", "\uff21\u0308\u0301",
    "\ufb01\u0301", "\t\u0301", " \u0301", "x\u00a8", "\u00a8", "a\u0308\u0304", "\u0600" "1",
    "Ｆｕｌｌ　ｗｉｄｔｈ", "ﬁ ﬂ ﬃ", "Ⅻ ① ½ ² ™ ㎏", "ǅ ĳ ŉ", "ｶﾞｷﾞ", "㍻", "…",
    "zero\u200bwidth\u200djoin\ufeff", "soft\u00adhyphen", "\u2581x", " \u2581x",
    "\x01\x02c\x7f", "\u2028\u2029\u0085", "\u00a0\u3000\u2003", "가 \u1100\u1161 \u1100\u1161\u11a8",
    "😀👍🏽", "中文 日本語", "café naïve",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", default=os.path.join(ROOT, "..", "shared", "assets"))
    args = ap.parse_args()
    import google.protobuf
    import sentencepiece as spm
    import tokenizers
    from tokenizers import Tokenizer

    folder = os.path.join(args.assets, "flan-t5-small")
    hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "spiece.model"))
    versions = {"tokenizers": tokenizers.__version__, "sentencepiece": spm.__version__,
                "protobuf": google.protobuf.__version__}

    os.makedirs(OUT, exist_ok=True)
    lines = make_corpus(args.assets)
    with open(os.path.join(OUT, "corpus.txt"), "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
    print(f"corpus: {len(lines)} lines")
    recs = records(lines)

    write_jsonl(os.path.join(OUT, "tokenizers.jsonl"),
                {"reference": "tokenizers on flan-t5-small/tokenizer.json", "versions": versions},
                lambda text: hf_record(hf, text), lines, recs)
    write_jsonl(os.path.join(OUT, "sentencepiece.jsonl"),
                {"reference": "sentencepiece on flan-t5-small/spiece.model", "versions": versions},
                lambda text: sp_record(sp, text), lines, recs)
    differ = sum(1 for i, n in recs
                 if hf.encode("\n".join(lines[i:i + n]), add_special_tokens=False).ids
                 != sp.encode("\n".join(lines[i:i + n])))
    print(f"tokenizers and sentencepiece differ on {differ} of {len(recs)} texts")

    cases = [{"text": t, "tokenizers": hf.normalizer.normalize_str(t), "sentencepiece": sp.normalize(t)}
             for t in NORMALIZE_CASES]
    path = os.path.join(OUT, "normalize.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"versions": versions, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
