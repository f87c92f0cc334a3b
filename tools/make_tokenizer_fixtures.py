#!/usr/bin/env python3
"""Writes the tokenizer and chat-template reference fixtures used by tests/test_tokenizer.c and
tests/test_chat.c (dev-time only; qlm itself never runs Python).

    python3 tools/make_tokenizer_fixtures.py [--assets ../shared/assets] [--gguf PATH]

Outputs (under tests/fixtures/):
  tokenizer/corpus.txt     >= 1000 deterministic lines (prose, code, many scripts, emoji/ZWJ, numbers,
                           whitespace runs, special-token strings, URLs, punctuation); no line holds "\\n".
  tokenizer/<name>.jsonl   line 1: {"meta": {...}}; then one record per text:
                           {"i": first line, "n": line count (text = "\\n".join(lines[i:i+n])),
                            "ids":  encode(text, add_special=1, parse_special=1)   (HF default encode),
                            "raw":  encode(text, add_special=0, parse_special=0)   (omitted when it equals
                                    "ids" without the BOS/EOS framing),
                            "dec":  decode(ids, skip_special=1)   (omitted when equal to text),
                            "decs": decode(ids, skip_special=0)   (omitted when equal to text; not
                                    written at all when meta "decs" is false, see class HF)}
                           Records from sentencepiece have only "raw" and "dec" (decode(raw)).
  chat/chat_cases.json     transformers' apply_chat_template renders for several templates.

References:
  tinyllama        tokenizers on tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json. That file has three
                   merges whose pieces hold ASCII spaces ("   ", "     ", "▁  "; the upstream pieces held
                   NBSP) which tokenizers refuses to parse; they are given to tokenizers as pairs split
                   where both halves and their concatenation are vocabulary pieces (qlm does the same).
  tinyllama_ms_*   the same vocabulary with the normalizer replaced by a Metaspace pre-tokenizer
                   (prepend_scheme first/split false as Mistral; always/split true); the test applies the
                   same edit to the asset at run time.
  tinystories656k  tokenizers on tinystories-656K-hf/tokenizer.json.
  llama2           sentencepiece on llama2-tokenizer/tokenizer.model (qlm loads tokenizer.bin).
  stories260k      sentencepiece on a BPE ModelProto built from stories260K/tok512.bin (no .model exists).
  smollm2          tokenizers with SmolLM2's published pre-tokenizer Sequence[Digits(individual_digits),
                   ByteLevel(add_prefix_space=false)] on the vocabulary/merges of the GGUF, as loaded by
                   transformers (AutoTokenizer.from_pretrained(dir, gguf_file=...)). transformers' own GGUF
                   conversion uses a plain ByteLevel pre-tokenizer; the script prints how many lines differ.
  smollm2_pre_*    the SmolLM2 vocabulary under the GPT-2, Llama 3 (with ignore_merges) and Qwen2
                   pre-tokenizers, to check qlm's other regexes.
"""
import argparse
import json
import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------
WORDS = ("the a an little girl boy named Lily Tom dog cat sun tree happy sad big small ran jumped "
         "saw played found wanted said asked house garden river mountain ball toy car friend mother "
         "father school teacher book story day night morning quickly slowly very really always never "
         "because however although tokenizer encoder decoder model weights matrix vector quantization "
         "international misunderstanding antidisestablishmentarianism pneumonoultramicroscopic").split()
CONTRACTIONS = ["it's", "don't", "we're", "I've", "I'm", "you'll", "he'd", "IT'S", "DON'T", "We'RE",
                "I'VE", "THEY'LL", "She'D", "o'clock", "rock'n'roll", "'quoted'", "''", "'s", "'T"]
SCRIPTS = [
    "Ελληνικά: η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська: Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश",
    "বাংলা: আমি বাংলায় গান গাই",
    "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า",
    "中文：我能吞下玻璃而不伤身体。天地玄黄，宇宙洪荒。",
    "日本語：いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナもﾊﾝｶｸも。",
    "한국어: 키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "Հայերեն: Բել դղյակի ձախ ժամն օֆ ազգությանը ցպահանջ չճշտած",
    "ქართული: სწრაფი ყავისფერი მელა",
    "አማርኛ: ሰማይ አይታረስ ንጉሥ አይከሰስ።",
    "Tiếng Việt: Tôi có thể ăn thủy tinh mà không hại gì.",
    "Türkçe: Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul ıİ",
    "Deutsch: Falsches Üben von Xylophonmusik quält jeden größeren Zwerg. ß ẞ",
    "Français: Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis.",
    "Español: El pingüino Wenceslao hizo kilómetros bajo exhaustiva lluvia y frío, añoraba a su querido cachorro.",
    "Polski: Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Íslenska: Kæmi ný öxi hér ykist þjófum nú bæði víl og ádrepa.",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u036b\u0343a\u0310l\u0346g\u0352o",
    "Math: ∀x∈ℝ: x²≥0, ∑ᵢ aᵢ = ∫₀¹ f(x)dx ≈ π/4 ≠ ∞; √2 ≤ ∛9 ⇒ ⊥",
    "Fullwidth: ＡＢＣ １２３ ｈｅｌｌｏ！ Ligatures: ﬁ ﬂ ﬀ. Roman: Ⅻ ⅷ. Circled: ① ②",
    "Private use \ue000\uf8ff and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 𓀀𓁐 𐍈 🀄",
]
EMOJI = ["😀", "🙂", "👍", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵", "1️⃣", "❤️", "🧑‍🤝‍🧑",
         "🤷‍♀️", "🐈‍⬛", "😶‍🌫️", "☕", "✨", "🔥🔥🔥", "🦙"]
SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|start_story|>",
            "<|end_story|>", "<|user|>", "<|assistant|>", "[INST]", "[/INST]", "<<SYS>>", "<0x41>",
            "<0x0A>", "<|im_start", "<s", "</s >", "< s>", "<|eot_id|>", "<repo_name>", "<filename>",
            "<|begin_of_text|>"]
WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", " \t ", "\r", "\r ", "\x0b", "\x0c", "\u00a0",
              "\u00a0\u00a0", "\u2003", "\u3000", "\u0085", "\u2028", "\u2029", "\u200b", "\ufeff",
              "\u1680", "\u202f", "\u205f", "\u2009", "\u180e"]
PUNCT = ["!!!", "???", "...", "…", "—", "--", "---", "***", "''", '""', "«»", "¿¡", "!?", "?!", ";;",
         "::", "()", "[]", "{}", "<>", "->", "=>", "==", "!=", "&&", "||", "#", "@", "$$", "%", "^^", "~",
         "`", "```", "\\", "/", "|", "_", "__init__", "''' '''", "“quoted”", "‘single’", "„low“", "·"]
URLS = ["https://example.com/path?q=1&r=two#frag", "http://www.test.org/index.html",
        "ftp://files.example.net/pub/file-1.2.3.tar.gz", "mailto:someone@example.com",
        "user.name+tag@sub.domain.co.uk", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        "/usr/local/lib/python3.11/site-packages", "C:\\Windows\\System32\\drivers\\etc\\hosts",
        "https://ja.wikipedia.org/wiki/日本語", "www.例え.jp", "git@github.com:org/repo.git"]
CODE = [
    "int main(int argc, char **argv) { return argc > 1 ? atoi(argv[1]) : 0; }",
    "    for (size_t i = 0; i < n; ++i) sum += a[i] * b[i];",
    "\tif (x == NULL) { return -1; }",
    "def encode(self, text: str) -> list[int]:",
    "        return [self.vocab[t] for t in tokens if t in self.vocab]",
    "const f = async (x) => { await fetch(`/api/${x}`); };",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "x = {'a': 1, \"b\": [1, 2, 3], 'c': None}  # comment",
    "#include <stdio.h>",
    "    }",
    "\t\t\treturn;",
    "fn main() { println!(\"Hello, {}!\", name); }",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>",
    "$ ls -la | grep '.txt' > out.log 2>&1",
    "matrix[i][j] += alpha*x[i]*y[j]; // rank-1 update",
    "if __name__ == '__main__':",
    "printf(\"%d %s %5.2f\\n\", 42, \"str\", 3.14159);",
    "  - name: build\n".rstrip("\n"),
    "{\"key\": \"value\", \"n\": 12345, \"f\": -0.5e-10, \"ok\": true}",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
]


def number_token(rng):
    kind = rng.randrange(10)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10 ** 9):,}"
    if kind == 3:
        return f"0x{rng.randrange(1 << 32):X}"
    if kind == 4:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if kind == 5:
        return f"+1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
    if kind == 6:
        return rng.choice(["½", "¾", "²³", "٣٤٥", "१२३", "１２３", "Ⅻ", "⑤", "๑๒", "3½", "10⁻⁹"])
    if kind == 7:
        return f"{rng.uniform(0, 1):.3e}"
    if kind == 8:
        return "".join(rng.choice("0123456789") for _ in range(rng.randrange(20, 60)))
    return f"v{rng.randrange(10)}.{rng.randrange(100)}.{rng.randrange(1000)}"


def prose(rng, n_words):
    out = []
    for k in range(n_words):
        r = rng.random()
        if r < 0.08:
            w = rng.choice(CONTRACTIONS)
        elif r < 0.12:
            w = number_token(rng)
        else:
            w = rng.choice(WORDS)
            if rng.random() < 0.1:
                w = w.capitalize()
            elif rng.random() < 0.03:
                w = w.upper()
        out.append(w)
        if rng.random() < 0.1:
            out[-1] += rng.choice([",", ".", ";", ":", "!", "?"])
    s = " ".join(out)
    return s[0].upper() + s[1:] + rng.choice([".", "!", "?", "", "..."])


def random_codepoints(rng, n):
    blocks = [(0x20, 0x7e), (0xa1, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f),
              (0x2100, 0x22ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xff00, 0xffef),
              (0x1f300, 0x1f6ff), (0x1f900, 0x1f9ff), (0x10000, 0x1007f), (0x20000, 0x2a6df)]
    s = []
    for _ in range(n):
        lo, hi = rng.choice(blocks)
        c = rng.randrange(lo, hi + 1)
        if c in (0x0a, 0x2028, 0x2029, 0x85):
            c = 0x20
        s.append(chr(c))
    return "".join(s)


def make_corpus():
    rng = random.Random(20240601)
    lines = []
    lines.append("Once upon a time, there was a little girl named Lily.")
    lines.append("Hello world")
    lines.append("")
    lines.append(" ")
    lines.append("  leading two spaces")
    lines.append("trailing spaces   ")
    lines.append("\ttab first")
    lines.append("a")
    lines.append("<s>")
    lines.append("</s>")
    lines.append("Hello</s>world")
    lines.append("Hello </s> world")
    lines.append("<s>Hi")
    lines.append("<|im_start|>user\tHi<|im_end|>")
    lines.append("<|start_story|>Once upon a time<|end_story|>")
    lines.append("<unk>x")
    lines.append("1234567890")
    lines.append(" 12 345 6789 ")
    lines.append("x\u0085y\u2028z\u00a0w\u3000v")
    for s in SCRIPTS:
        lines.append(s)
    for c in CODE:
        lines.append(c)
    for u in URLS:
        lines.append(u)
    for e in EMOJI:
        lines.append(e)
        lines.append(f"I {e} this {e}{e}!")
    for sp in SPECIALS:
        lines.append(sp)
        lines.append(f"before {sp} after")
        lines.append(f"x{sp}y")
    for w in WHITESPACE:
        lines.append(f"a{w}b")
        lines.append(f"{w}lead")
        lines.append(f"trail{w}")
        lines.append(f"word{w}{w}word {w}")
    for p in PUNCT:
        lines.append(p)
        lines.append(f"Wait{p} what{p}")
    while len(lines) < 1200:
        kind = rng.randrange(12)
        if kind <= 2:
            s = prose(rng, rng.randrange(3, 40))
        elif kind == 3:
            s = rng.choice(CODE)
            if rng.random() < 0.5:
                s = rng.choice(["", " ", "  ", "    ", "\t", "\t\t"]) + s.strip()
        elif kind == 4:
            s = rng.choice(SCRIPTS)
            a = rng.randrange(len(s))
            s = s[a:a + rng.randrange(5, 60)]
        elif kind == 5:
            s = " ".join(rng.choice(EMOJI) + rng.choice(["", " ", "", "!"]) for _ in range(rng.randrange(1, 6)))
        elif kind == 6:
            s = " ".join(number_token(rng) for _ in range(rng.randrange(1, 6)))
        elif kind == 7:
            s = rng.choice(WHITESPACE).join(rng.choice(WORDS) for _ in range(rng.randrange(2, 6)))
            s = rng.choice(WHITESPACE) * rng.randrange(0, 3) + s + rng.choice(WHITESPACE) * rng.randrange(0, 3)
        elif kind == 8:
            parts = [prose(rng, rng.randrange(1, 6)), rng.choice(SPECIALS), prose(rng, rng.randrange(1, 6))]
            s = rng.choice(["", " "]).join(parts)
        elif kind == 9:
            s = rng.choice(URLS) + " " + rng.choice(PUNCT) + rng.choice(PUNCT)
        elif kind == 10:
            s = random_codepoints(rng, rng.randrange(1, 30))
        else:
            pieces = [prose(rng, 4), rng.choice(SCRIPTS)[:20], rng.choice(EMOJI), number_token(rng),
                      rng.choice(PUNCT), rng.choice(CODE)[:25], rng.choice(WHITESPACE)]
            rng.shuffle(pieces)
            s = "".join(pieces)
        assert "\n" not in s
        lines.append(s)
    return lines


def records(lines):
    """(first line, count) of every text: each line, some 2-5 line groups, and one ~10 kB block."""
    out = [(i, 1) for i in range(len(lines))]
    rng = random.Random(7)
    for _ in range(60):
        i = rng.randrange(len(lines) - 5)
        out.append((i, rng.randrange(2, 6)))
    n, size = 0, 0
    while size < 10000 and n < len(lines):
        size += len(lines[n].encode()) + 1
        n += 1
    out.append((0, n))
    return out


# ---------------------------------------------------------------------------------------------
# Reference tokenizers
# ---------------------------------------------------------------------------------------------
def fixed_merges(model):
    """Merges as [left, right] pairs; a string holding more than one space is split where both
    halves and their concatenation are vocabulary pieces."""
    vocab = model["vocab"]
    out = []
    for m in model["merges"]:
        if isinstance(m, list):
            out.append(m)
            continue
        if m.count(" ") == 1:
            out.append(m.split(" "))
            continue
        for k, c in enumerate(m):
            if c == " " and m[:k] in vocab and m[k + 1:] in vocab and m[:k] + m[k + 1:] in vocab:
                out.append([m[:k], m[k + 1:]])
                break
        else:
            raise ValueError(f"cannot split merge {m!r}")
    return out


def hf_from_json(j):
    from tokenizers import Tokenizer
    j = json.loads(json.dumps(j))
    j["model"]["merges"] = fixed_merges(j["model"])
    return Tokenizer.from_str(json.dumps(j))


class HF:
    """tokenizers.Tokenizer wrapped to the fixture record format.

    tokenizers stores an added token with normalized=true under its normalized form ("▁<unk>"), so
    decode(skip_special_tokens=True) keeps such special tokens and renders them with a space
    (TinyStories-656K). qlm skips them; for those tokenizers "dec" is decode() of the ids without
    the special ids, and "decs" is not written (meta "decs": false)."""

    def __init__(self, tok, name, source, add_bos, add_eos):
        self.tok, self.name, self.source, self.add_bos, self.add_eos = tok, name, source, add_bos, add_eos
        added = tok.get_added_tokens_decoder()
        self.quirk = any(a.special and a.normalized for a in added.values())
        self.special_ids = {i for i, a in added.items() if a.special}

    def meta(self):
        return {"tokenizer": self.name, "reference": self.source, "add_bos": self.add_bos,
                "add_eos": self.add_eos, "decs": not self.quirk}

    def record(self, text):
        t = self.tok
        t.encode_special_tokens = False
        ids = t.encode(text, add_special_tokens=True).ids
        t.encode_special_tokens = True
        raw = t.encode(text, add_special_tokens=False).ids
        t.encode_special_tokens = False
        rec = {"ids": ids}
        framed = ids[(1 if self.add_bos else 0):len(ids) - (1 if self.add_eos else 0)]
        if raw != framed:
            rec["raw"] = raw
        if self.quirk:
            dec = t.decode([i for i in ids if i not in self.special_ids], skip_special_tokens=False)
        else:
            dec = t.decode(ids, skip_special_tokens=True)
        if dec != text:
            rec["dec"] = dec
        decs = t.decode(ids, skip_special_tokens=False)
        if not self.quirk and decs != text:
            rec["decs"] = decs
        return rec


class SP:
    def __init__(self, proc, name, source):
        self.proc, self.name, self.source = proc, name, source

    def meta(self):
        return {"tokenizer": self.name, "reference": self.source, "add_bos": True, "add_eos": False}

    def record(self, text):
        raw = self.proc.encode(text)
        rec = {"raw": raw}
        dec = self.proc.decode(raw)
        if dec != text:
            rec["dec"] = dec
        return rec


def write_jsonl(path, ref, lines, recs):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": ref.meta()}, ensure_ascii=False) + "\n")
        for i, n in recs:
            rec = {"i": i}
            if n != 1:
                rec["n"] = n
            rec.update(ref.record("\n".join(lines[i:i + n])))
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


def sp_from_llama2c(path):
    """A SentencePiece BPE model with the pieces and scores of a llama2.c tokenizer.bin."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    data = open(path, "rb").read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off, pieces = 4, []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append((data[off:off + n].decode("utf-8"), score))
        off += n
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(pieces)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (p, score) in enumerate(pieces):
        sp = m.pieces.add()
        sp.score = score
        if i == 0:
            sp.piece, sp.type = "<unk>", pb.ModelProto.SentencePiece.UNKNOWN
        elif i in (1, 2):
            sp.piece, sp.type = ("<s>", "</s>")[i - 1], pb.ModelProto.SentencePiece.CONTROL
        elif len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            sp.piece, sp.type = p, pb.ModelProto.SentencePiece.BYTE
        else:
            sp.piece, sp.type = p.replace(" ", "\u2581"), pb.ModelProto.SentencePiece.NORMAL
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def smollm2_backend(gguf_path):
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    return t, json.loads(t.backend_tokenizer.to_str())


def with_pre(j, pre, ignore_merges=False):
    from tokenizers import Tokenizer
    j = json.loads(json.dumps(j))
    j["pre_tokenizer"] = pre
    j["model"]["ignore_merges"] = ignore_merges
    return Tokenizer.from_str(json.dumps(j))


def split_then_bytelevel(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def metaspace_variant(j, scheme, split):
    """What tests/test_tokenizer.c does to the TinyLlama tokenizer.json at run time."""
    j = json.loads(json.dumps(j))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
                          "split": split}
    return hf_from_json(j)


def tokenizer_fixtures(assets, gguf_path):
    import sentencepiece as spm
    out = os.path.join(FIX, "tokenizer")
    os.makedirs(out, exist_ok=True)
    lines = make_corpus()
    with open(os.path.join(out, "corpus.txt"), "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
    recs = records(lines)
    subset = [r for r in recs if r[0] < 300 and r[1] == 1] + [recs[-1]]

    tl_path = os.path.join(assets, "tinyllama-1.1b-chat-v1.0-tokenizer", "tokenizer.json")
    tl_json = json.load(open(tl_path, encoding="utf-8"))
    write_jsonl(os.path.join(out, "tinyllama.jsonl"),
                HF(hf_from_json(tl_json), "tinyllama", "tokenizers on tokenizer.json", True, False), lines, recs)
    for scheme, split in (("first", False), ("always", True)):
        name = f"tinyllama_ms_{scheme}"
        write_jsonl(os.path.join(out, name + ".jsonl"),
                    HF(metaspace_variant(tl_json, scheme, split), name,
                       f"tokenizers, Metaspace(prepend_scheme={scheme}, split={split})", True, False),
                    lines, subset)

    ts_path = os.path.join(assets, "tinystories-656K-hf", "tokenizer.json")
    ts_json = json.load(open(ts_path, encoding="utf-8"))
    write_jsonl(os.path.join(out, "tinystories656k.jsonl"),
                HF(hf_from_json(ts_json), "tinystories656k", "tokenizers on tokenizer.json", True, False),
                lines, recs)

    sp = spm.SentencePieceProcessor(model_file=os.path.join(assets, "llama2-tokenizer", "tokenizer.model"))
    write_jsonl(os.path.join(out, "llama2.jsonl"), SP(sp, "llama2", "sentencepiece on tokenizer.model"),
                lines, recs)
    sp260 = sp_from_llama2c(os.path.join(assets, "stories260K", "tok512.bin"))
    write_jsonl(os.path.join(out, "stories260k.jsonl"),
                SP(sp260, "stories260k", "sentencepiece on a ModelProto built from tok512.bin"), lines, recs)

    tf_tok, smol = smollm2_backend(gguf_path)
    smol_pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    smol_tok = with_pre(smol, smol_pre)
    write_jsonl(os.path.join(out, "smollm2.jsonl"),
                HF(smol_tok, "smollm2", "tokenizers (Digits + ByteLevel) on the GGUF vocabulary", False, False),
                lines, recs)
    differ = sum(1 for i, n in recs if tf_tok.encode("\n".join(lines[i:i + n]), add_special_tokens=False)
                 != smol_tok.encode("\n".join(lines[i:i + n]), add_special_tokens=False).ids)
    print(f"smollm2: transformers' GGUF tokenizer (no Digits step) differs on {differ} of {len(recs)} texts")

    variants = {
        "gpt2": (with_pre(smol, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                 "use_regex": True}), False),
        "llama3": (with_pre(smol, split_then_bytelevel(LLAMA3_REGEX), ignore_merges=True), True),
        "qwen2": (with_pre(smol, split_then_bytelevel(QWEN2_REGEX)), False),
    }
    for name, (tok, ignore) in variants.items():
        ref = HF(tok, f"smollm2_pre_{name}", f"tokenizers, {name} pre-tokenizer, ignore_merges={ignore}",
                 False, False)
        write_jsonl(os.path.join(out, f"smollm2_pre_{name}.jsonl"), ref, lines, recs)


# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")

CONVERSATIONS = {
    "system_multi": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "  And 3+3?\n"},
    ],
    "no_system_multi": [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": " Hello! How can I help? "},
        {"role": "user", "content": "Tell me a story about a llama 🦙."},
    ],
    "single": [{"role": "user", "content": "Once upon a time"}],
}


def chat_fixtures(assets, gguf_path):
    from transformers.utils.chat_template_utils import render_jinja_template
    import gguf
    reader = gguf.GGUFReader(gguf_path)
    field = reader.fields["tokenizer.chat_template"]
    smol_template = bytes(field.parts[field.data[0]]).decode("utf-8")
    tl_cfg = json.load(open(os.path.join(assets, "tinyllama-1.1b-chat-v1.0-tokenizer", "tokenizer_config.json")))
    templates = [
        ("smollm2", "chatml", smol_template, "<|im_start|>", "<|im_end|>"),
        ("qwen2", "chatml", QWEN2_TEMPLATE, "", "<|im_end|>"),
        ("chatml", "chatml", CHATML_TEMPLATE, "", "<|im_end|>"),
        ("tinyllama", "zephyr", tl_cfg["chat_template"], "<s>", "</s>"),
        ("llama2", "llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
        ("llama3", "llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
    ]
    cases = []
    for name, family, tmpl, bos, eos in templates:
        for conv_name, msgs in CONVERSATIONS.items():
            for gen in (False, True):
                rendered, _ = render_jinja_template(conversations=[msgs], chat_template=tmpl,
                                                    add_generation_prompt=gen, bos_token=bos, eos_token=eos)
                cases.append({"name": f"{name}/{conv_name}/gen{int(gen)}", "family": family,
                              "template": tmpl, "bos": bos, "eos": eos, "messages": msgs,
                              "add_generation_prompt": gen, "expected": rendered[0]})
    os.makedirs(os.path.join(FIX, "chat"), exist_ok=True)
    path = os.path.join(FIX, "chat", "chat_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"reference": "transformers.utils.chat_template_utils.render_jinja_template",
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"wrote {os.path.relpath(path, ROOT)} ({len(cases)} cases)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", default=os.path.join(ROOT, "..", "shared", "assets"))
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/qlm/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    if not os.path.exists(args.gguf):
        sys.exit(f"missing {args.gguf} (see scripts/setup.sh)")
    tokenizer_fixtures(args.assets, args.gguf)
    chat_fixtures(args.assets, args.gguf)


if __name__ == "__main__":
    main()
