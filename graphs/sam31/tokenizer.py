"""A ``tokenizers`` tokenizer.json equivalent to Meta's SAM 3.1 ``SimpleTokenizer``.

    python -m graphs.sam31.tokenizer       # regenerate ftfy_table.py (needs Meta's reference env)

Meta's text cleaning becomes replace rules (``ftfy_table.py``, Unicode NFC, the five XML entities) before
CLIP's BPE; what ftfy does from context, and other HTML entities, tokenize differently. Meta's steps and
those gaps: docs/sam31.md, "The tokenizer".
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

CONTEXT_LENGTH = 32  # VETextEncoder(context_length=32) in Meta's model builder
NUM_MERGES = 49152 - 256 - 2  # SimpleTokenizer reads merges[1 : 49152 - 256 - 2 + 1]
START, END = "<start_of_text>", "<end_of_text>"
PAD_ID = 0  # SimpleTokenizer pads with zeros (which is also the id of "!")
# Meta's pattern without its special-token alternatives (those are added tokens here)
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
XML_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&#39;", "'"), ("&apos;", "'"), ("&amp;", "&"))


class TokenizerError(Exception):
    pass


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the alphabet CLIP's BPE and ByteLevel share)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def read_merges(bpe_path: Path) -> list[tuple[str, str]]:
    """The merges Meta uses from its gzipped vocab file (the first line is a version header)."""
    try:
        lines = gzip.open(bpe_path).read().decode("utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{bpe_path} is not Meta's gzipped BPE vocab file ({exc})") from exc
    merges = [tuple(line.split()) for line in lines[1:NUM_MERGES + 1]]
    if len(merges) != NUM_MERGES or any(len(m) != 2 for m in merges):
        raise TokenizerError(f"{bpe_path} holds {len(merges)} merges, not the {NUM_MERGES} pairs of CLIP's "
                             "bpe_simple_vocab_16e6.txt.gz")
    return merges


def vocabulary(merges) -> dict[str, int]:
    """Token -> id in SimpleTokenizer's order."""
    alphabet = list(bytes_to_unicode().values())
    tokens = alphabet + [a + "</w>" for a in alphabet] + ["".join(m) for m in merges] + [START, END]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise TokenizerError("the BPE vocab file yields duplicate tokens; it is not CLIP's vocab")
    return vocab


def _char_class(chars) -> str:
    return "[" + "".join(f"\\x{{{ord(c):X}}}" for c in sorted(chars)) + "]"


def _cleaning_rules():
    """Normalizers for Meta's basic_clean + whitespace_clean + lower, in its order."""
    from tokenizers import Regex, normalizers

    from .ftfy_table import CHAR_FIXES

    by_target: dict[str, list[str]] = {}
    for code, target in CHAR_FIXES.items():
        by_target.setdefault(target, []).append(chr(code))
    rules = [normalizers.Replace(Regex(_char_class(chars)), target) for target, chars in sorted(by_target.items())]
    rules.append(normalizers.NFC())
    for _ in range(2):  # html.unescape(html.unescape(...))
        rules += [normalizers.Replace(entity, char) for entity, char in XML_ENTITIES]
    rules += [
        normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Strip(),
        # str.lower's final sigma: a capital sigma after a letter and not before one
        normalizers.Replace(Regex(r"(?<=\p{L})\x{3A3}(?!\p{L})"), "\u03c2"),
        normalizers.Lowercase(),
    ]
    return normalizers.Sequence(rules)


def build_tokenizer(bpe_path: Path, context_length: int = CONTEXT_LENGTH):
    """A ``tokenizers.Tokenizer`` that gives SimpleTokenizer's ids, padded and truncated as Meta does."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    merges = read_merges(Path(bpe_path))
    vocab = vocabulary(merges)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, end_of_word_suffix="</w>", fuse_unk=False))
    tok.normalizer = _cleaning_rules()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # Meta matches the special tokens in the cleaned text, so a prompt that spells one gets its id
    tok.add_special_tokens([AddedToken(t, normalized=True, special=True) for t in (START, END)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{START} $A {END}", special_tokens=[(START, vocab[START]), (END, vocab[END])])
    tok.decoder = decoders.ByteLevel()
    # Meta keeps [start] + the first length-2 ids + [end]: truncating the text to length-2 ids and adding
    # the two specials is the same
    tok.enable_truncation(max_length=context_length)
    tok.enable_padding(length=context_length, pad_id=PAD_ID, pad_token="!")
    return tok


def write_tokenizer(bpe_path: Path, out_dir: Path, context_length: int = CONTEXT_LENGTH) -> Path:
    """Write ``out_dir/tokenizer.json``; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    build_tokenizer(bpe_path, context_length).save(str(path))
    return path


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Ids of each text, [context_length] each (padding and truncation as the tokenizer.json says)."""
    return [e.ids for e in tokenizer.encode_batch(list(texts))]


def regenerate_ftfy_table(reference_env: Path, out: Path | None = None) -> Path:
    """Rewrite ftfy_table.py from Meta's ftfy (run by reference/sam31/tokenize_texts.py in the env)."""
    import tempfile

    from graphs.sam31 import reference as ref

    out = Path(out or Path(__file__).with_name("ftfy_table.py"))
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "table.json"
        ref.run_script(reference_env, "tokenize_texts.py", ["--char-table", "--out", table])
        data = json.loads(table.read_text(encoding="utf-8"))
    rows = "".join(f"    0x{int(c):04X}: {v!r},\n" for c, v in sorted(data["map"].items(), key=lambda kv: int(kv[0])))
    out.write_text(
        '"""Characters Meta\'s SAM 3.1 text cleaning changes on their own, beyond Unicode NFC.\n\n'
        "Generated, do not edit: ``reference/sam31/tokenize_texts.py --char-table`` in the reference env\n"
        f"(ftfy {data['ftfy']}: ``html.unescape(html.unescape(ftfy.fix_text(c)))`` for every code point c).\n"
        "graphs/sam31/tokenizer.py turns it into replace rules of the exported tokenizer.json.\n"
        '"""\n\n'
        f"FTFY_VERSION = {data['ftfy']!r}\n\n# code point -> replacement text\nCHAR_FIXES = {{\n{rows}}}\n")
    return out


if __name__ == "__main__":  # python -m graphs.sam31.tokenizer: regenerate ftfy_table.py
    from graphs import sam31_reference as _ref

    _env = _ref.find_env()
    if _env is None:
        raise SystemExit(f"error: {_ref.missing_reason()}")
    print(regenerate_ftfy_table(_env))
