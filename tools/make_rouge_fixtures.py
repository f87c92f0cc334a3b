#!/usr/bin/env python3
"""Writes the ROUGE reference fixtures used by tests/test_rouge.c (dev-time only; qlm never runs Python).

    pip install rouge-score nltk
    python3 tools/make_rouge_fixtures.py [--assets ../shared/assets]

Deterministic (fixed seeds): a second run gives the same bytes with the same package versions.
Reads dialogsum/dialogsum.test.jsonl (for the pairs) and every dialogsum/*.jsonl (for the word list).

Outputs (under tests/fixtures/rouge/):
  preds.jsonl        one {"fname", "summary"} per pair: the prediction
  refs.jsonl         one {"fname", "summary1", "summary2", "summary3"} per pair, same order: the
                     DialogSum references, some edited (split into lines, emptied, unicode added)
  expected.json      "versions"; "pairs": per pair, its fname, kind, the reference fields it is scored
                     against and [precision, recall, fmeasure] for rouge1, rouge2, rougeL, rougeLsum
                     (RougeScorer(use_stemmer=True): score() for one reference, score_multi() for
                     several); "mean": the mean of each number over the pairs; "cli": the same means
                     when every pair uses the reference fields named by "ref_field" (what
                     `qlm rouge --ref-field ...` prints)
  porter_stems.tsv   "word<TAB>stem" lines, sorted: nltk's PorterStemmer().stem (the stemmer
                     rouge_score uses) on every distinct token of DialogSum plus words built to hit
                     each rule of the algorithm
"""
import argparse
import glob
import json
import os
import random
import re
import sys
from importlib.metadata import version

import nltk
from nltk.stem import porter
from rouge_score import rouge_scorer, tokenize

METRICS = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
REF_FIELDS = ["summary1", "summary2", "summary3"]
OUT = "tests/fixtures/rouge"

SCORER = rouge_scorer.RougeScorer(METRICS, use_stemmer=True)


def sentences(text):
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def score(pred, refs):
    s = SCORER.score(refs[0], pred) if len(refs) == 1 else SCORER.score_multi(refs, pred)
    return {m: [s[m].precision, s[m].recall, s[m].fmeasure] for m in METRICS}


def mean(scored):
    keys = ["precision", "recall", "fmeasure"]
    return {m: {k: sum(p[m][i] for p in scored) / len(scored) for i, k in enumerate(keys)} for m in METRICS}


UNICODE_EDITS = [
    ("a", "\u00e1"), ("e", "\u00e9"), ("o", "\u00f6"),  # accented letters split words
    ("I", "\u0130"),  # U+0130 lowercases to "i" + U+0307: a token "i" and a separator
    ("K", "\u212a"), ("k", "\u212a"),  # KELVIN SIGN lowercases to ASCII "k"
    (" ", "\u00a0"), (" ", "\u2003"), (" ", "\u200b"),  # other spaces; a zero-width space
    ("'", "\u2019"), ("-", "\u2014"),
]


def unicode_variant(rng, text):
    words = text.split(" ")
    for _ in range(rng.randint(2, 5)):
        i = rng.randrange(len(words))
        old, new = rng.choice(UNICODE_EDITS)
        words[i] = words[i].replace(old, new)
    extras = ["\U0001F600", "\u4f60\u597d", "\uff46\uff55\uff4c\uff4c", "na\u00efve caf\u00e9", "e\u0301t\u00e9",
              "\u0130STANBUL", "5\u00b0C", "\u00bd", "x\u00b2", "\u212aELVIN"]
    words.insert(rng.randrange(len(words) + 1), rng.choice(extras))
    return " ".join(words)


def punct_variant(rng, text):
    choice = rng.randrange(4)
    if choice == 0:
        return text.upper()
    if choice == 1:
        return re.sub(r" ", lambda _: rng.choice([" ", ", ", " -- ", "... ", " (", ") ", "!? "]), text)
    if choice == 2:
        words = text.split()
        for _ in range(3):
            words.insert(rng.randrange(len(words) + 1), rng.choice(["4pm", "$100", "2nd", "10:30", "3.5", "#1", "50%"]))
        return " ".join(words)
    return text.replace(" ", "  \t ").title()


def inflect(rng, text):
    out = []
    for w in text.split():
        if w.isalpha() and len(w) > 3 and rng.random() < 0.5:
            w = w + rng.choice(["s", "ing", "ed", "ly", "ness", "ation", "ful", "ize", "er"])
        out.append(w)
    return " ".join(out)


def lines_of(rng, text):
    """The sentences of text on separate lines, with some blank lines and CRLFs."""
    sents = sentences(text) or [text]
    sep = rng.choice(["\n", "\n", "\n\n", "\r\n", "\n \n"])
    return sep.join(sents)


def make_pairs(rows, rng):
    order = list(range(len(rows)))
    rng.shuffle(order)
    plan = ([("copy", 20), ("copy_of_summary2", 10), ("other_dialogue", 40), ("truncated", 40), ("shuffled", 30),
             ("first_turn", 30), ("dialogue_lines", 15), ("whole_dialogue", 5), ("empty", 8), ("punct_digits_case", 30),
             ("unicode", 25), ("multiline", 40), ("repeated", 15), ("inflected", 15), ("empty_ref", 6)])
    pairs = []
    it = iter(order)
    for kind, count in plan:
        for j in range(count):
            row = rows[next(it)]
            refs = {f: row[f] for f in REF_FIELDS}
            s1 = row["summary1"]
            words = s1.split()
            turns = row["dialogue"].split("\n")
            multi = j % 2 == 1
            if kind == "copy":
                pred = s1
            elif kind == "copy_of_summary2":
                pred, multi = row["summary2"], True
            elif kind == "other_dialogue":
                pred = rows[rng.randrange(len(rows))]["summary" + str(rng.randint(1, 3))]
            elif kind == "truncated":
                pred = " ".join(words[:rng.randint(1, max(1, len(words) - 1))])
            elif kind == "shuffled":
                w = words[:]
                rng.shuffle(w)
                pred = " ".join(w)
            elif kind == "first_turn":
                first = turns[0]
                pred = first if j % 3 == 0 else (sentences(first.split(": ", 1)[-1]) or [first])[0]
            elif kind == "dialogue_lines":
                start = rng.randrange(max(1, len(turns) - 3))
                pred = "\n".join(turns[start:start + rng.randint(2, 6)])
            elif kind == "whole_dialogue":
                pred = row["dialogue"]
            elif kind == "empty":
                pred = ["", " ", "\n", "...", "!!! ??", "\n\n", "\u00e9\u00e8", "\t \r\n"][j]
            elif kind == "punct_digits_case":
                pred = punct_variant(rng, s1 if j % 3 else row["summary2"])
            elif kind == "unicode":
                pred = unicode_variant(rng, s1)
                if j % 3 == 0:
                    refs["summary1"] = unicode_variant(rng, refs["summary1"])
            elif kind == "multiline":
                src = s1 if j % 4 else rows[rng.randrange(len(rows))]["summary1"]
                pred = lines_of(rng, src)
                if j % 2 == 0:
                    refs = {f: lines_of(rng, t) for f, t in refs.items()}
            elif kind == "repeated":
                sents = sentences(s1) or [s1]
                pred = "\n".join(sents + sents) if j % 2 else s1 + " " + s1
                if j % 3 == 0:
                    refs["summary1"] = "\n".join(sentences(refs["summary1"]) * 2)
            elif kind == "inflected":
                pred = inflect(rng, s1)
            elif kind == "empty_ref":
                pred = s1 if j % 2 else ""
                refs["summary1"] = ["", " ", "?!", "", "\n", "-- --"][j]
                multi = False
            else:
                raise AssertionError(kind)
            pairs.append({"fname": row["fname"], "kind": kind, "pred": pred, "refs": refs,
                          "ref_fields": REF_FIELDS if multi else ["summary1"]})
    return pairs


def stem_words(assets, rng):
    words = set()
    for path in sorted(glob.glob(os.path.join(assets, "dialogsum", "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                for k, v in json.loads(line).items():
                    if isinstance(v, str) and k != "fname":
                        words.update(tokenize.tokenize(v, None))
    n_dialogsum = len(words)
    # Stems and suffixes that exercise every rule, NLTK's irregular forms, y handling, digits.
    bases = ["rel", "condit", "val", "hesit", "digit", "conform", "radic", "differ", "vil", "analog", "vietnam",
             "predic", "oper", "feud", "decis", "hope", "call", "form", "sensi", "triplic", "electr", "good", "reviv",
             "allow", "infer", "airlin", "gyroscop", "adjust", "defens", "irrit", "replac", "depend", "adopt",
             "homolog", "commun", "activ", "angular", "effect", "bowdler", "prob", "rat", "ceas", "controll", "roll",
             "geo", "theo", "archaeo", "philo", "fl", "sp", "d", "t", "happ", "enjo", "b", "tr", "y", "yy", "sy",
             "a", "o", "ow", "fil", "hop", "tann", "fizz", "hiss", "fall", "agr", "f", "bl", "conflat", "troubl",
             "siz", "mot", "a1", "9", "x2y", "bey", "ey", "oy", "bay", "ayy", "yay"]
    suffixes = ["", "s", "es", "ss", "sses", "ies", "ied", "ed", "eed", "ing", "y", "ly", "e", "l", "ll", "at", "bl",
                "iz", "ational", "tional", "enci", "anci", "izer", "bli", "abli", "alli", "entli", "eli", "ousli",
                "ization", "ation", "ator", "alism", "iveness", "fulness", "ousness", "aliti", "iviti", "biliti",
                "fulli", "logi", "icate", "ative", "alize", "iciti", "ical", "ful", "ness", "al", "ance", "ence",
                "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "sion", "tion", "ion", "ou", "ism", "ate",
                "iti", "ous", "ive", "ize", "ationalli", "fulnesses", "izations", "ically", "ements", "ying",
                "yed", "yly", "iedly"]
    words.update(b + s for b in bases for s in suffixes)
    words.update(["sky", "skies", "dying", "lying", "tying", "news", "innings", "inning", "outings", "outing",
                  "cannings", "canning", "howe", "proceed", "exceed", "succeed", "proceeds", "exceeding"])
    letters = "abcdefghijklmnopqrstuvwxyz"
    for _ in range(3000):  # random words rich in vowels, y and double letters
        n = rng.randint(1, 12)
        words.add("".join(rng.choice("aeiouyybcdlnrstgmpz" if rng.random() < 0.5 else letters) for _ in range(n)))
    assert all(re.fullmatch(r"[a-z0-9]+", w) for w in words)
    return sorted(words), n_dialogsum


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default="../shared/assets")
    args = ap.parse_args()
    stemmer = SCORER._tokenizer._stemmer
    assert isinstance(stemmer, porter.PorterStemmer) and stemmer.mode == porter.PorterStemmer.NLTK_EXTENSIONS, \
        "rouge_score is expected to use nltk's PorterStemmer in NLTK_EXTENSIONS mode"
    with open(os.path.join(args.assets, "dialogsum", "dialogsum.test.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    pairs = make_pairs(rows, random.Random(20240611))
    for p in pairs:
        p["scores"] = score(p["pred"], [p["refs"][f] for f in p["ref_fields"]])
    cli = []
    for fields in (["summary1"], REF_FIELDS):
        cli.append({"ref_field": ",".join(fields),
                    "mean": mean([score(p["pred"], [p["refs"][f] for f in fields]) for p in pairs])})
    versions = {"python": sys.version.split()[0], "rouge_score": version("rouge-score"), "nltk": nltk.__version__,
                "absl_py": version("absl-py"), "numpy": version("numpy")}

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "preds.jsonl"), "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps({"fname": p["fname"], "summary": p["pred"]}) + "\n")
    with open(os.path.join(OUT, "refs.jsonl"), "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps({"fname": p["fname"], **p["refs"]}) + "\n")
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        head = {"versions": versions, "use_stemmer": True, "metrics": METRICS,
                "mean": mean([p["scores"] for p in pairs]), "cli": cli}
        f.write(json.dumps(head)[:-1] + ',\n"pairs": [\n')
        f.write(",\n".join(json.dumps({"fname": p["fname"], "kind": p["kind"], "ref_fields": p["ref_fields"],
                                       **p["scores"]}) for p in pairs))
        f.write("\n]}\n")
    words, n_dialogsum = stem_words(args.assets, random.Random(7))
    with open(os.path.join(OUT, "porter_stems.tsv"), "w", encoding="utf-8") as f:
        for w in words:
            f.write(f"{w}\t{stemmer.stem(w)}\n")
    kinds = sorted({p["kind"] for p in pairs})
    print(f"{len(pairs)} pairs ({len(kinds)} kinds), {len(words)} stem words ({n_dialogsum} from DialogSum); "
          f"versions {versions}")
    for c in cli:
        print(c["ref_field"], {m: round(c["mean"][m]["fmeasure"], 4) for m in METRICS})


if __name__ == "__main__":
    main()
