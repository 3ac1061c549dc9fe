"""Token ids of Meta's own SAM 3.1 tokenizer for a list of strings (run in the reference env).

    <env>/venv/bin/python reference/sam31/tokenize_texts.py --bpe BPE.txt.gz --texts IN.json --out OUT.json
    <env>/venv/bin/python reference/sam31/tokenize_texts.py --char-table --out TABLE.json

The first form tokenizes every string of IN.json (a JSON list) with ``SimpleTokenizer`` exactly as
``VETextEncoder`` builds and calls it (context length 32, the default "lower" cleaning) and writes
``{"texts": [...], "ids": [[32 ints], ...], "cleaned": [...]}`` (``cleaned``: Meta's text cleaning
alone, for diagnosing a mismatch).

The second form writes the characters whose cleaning (``ftfy.fix_text`` then ``html.unescape`` twice,
Meta's ``basic_clean`` without the strip) changes them on their own, beyond what Unicode NFC does:
``{"ftfy": version, "map": {"<code point>": "<replacement>"}}``. graphs/sam31/tokenizer.py turns that
table into replace rules of the exported tokenizer.json, since the runtime's ``tokenizers`` package has
no ftfy.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import unicodedata
from pathlib import Path

import shim  # noqa: F401  (puts Meta's source on sys.path)

CONTEXT_LENGTH = 32  # VETextEncoder(context_length=32), model_builder.py


def tokenize(bpe: Path, texts: list[str]) -> dict:
    from sam3.model.tokenizer_ve import SimpleTokenizer, get_clean_fn

    tok = SimpleTokenizer(bpe_path=str(bpe))
    ids = tok(texts, context_length=CONTEXT_LENGTH) if texts else None
    clean = get_clean_fn("lower")
    return {"texts": texts, "ids": [] if ids is None else ids.tolist(), "cleaned": [clean(t) for t in texts],
            "context_length": CONTEXT_LENGTH, "vocab_size": tok.vocab_size}


def char_table() -> dict:
    import ftfy

    table = {}
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:  # lone surrogates cannot be in a Python str from a prompt
            continue
        s = chr(c)
        fixed = html.unescape(html.unescape(ftfy.fix_text(s)))
        if fixed != s and unicodedata.normalize("NFC", s) != fixed:
            table[str(c)] = fixed
    return {"ftfy": ftfy.__version__, "map": table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bpe", type=Path)
    ap.add_argument("--texts", type=Path)
    ap.add_argument("--char-table", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.char_table:
        result = char_table()
    else:
        if a.bpe is None or a.texts is None:
            ap.error("--bpe and --texts are needed (or --char-table)")
        result = tokenize(a.bpe, json.loads(a.texts.read_text(encoding="utf-8")))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, ensure_ascii=False, indent=0), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
