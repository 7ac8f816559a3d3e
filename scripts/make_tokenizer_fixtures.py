#!/usr/bin/python3
"""Writes the fixtures under tests/fixtures/tokenizer/ that tests/test_tokenizer.cpp reads.

Regenerate with Debian's Python and its `regex` module (apt-get install -y python3-regex):
  /usr/bin/python3 scripts/make_tokenizer_fixtures.py

  pretokenize.json   GPT-2's own pre-tokenisation regex (from openai/gpt-2 src/encoder.py) applied to sample
                     strings: [{"text": ..., "words": [...]}, ...]. Checks memtrain's hand-written splitter.
  tiny_encoder.json  A GPT-2-style encoder: the 256 bytes in GPT-2's bytes_to_unicode order (ids 0..255, as in
  tiny_vocab.bpe     the real GPT-2 files), five merges (ids 256..260) and "<|endoftext|>" (261).
  tiny_expected.json Ids of a few texts under those files, from GPT-2's bpe() below: the test compares them
                     with memtrain's encode() and with ids worked out by hand.
"""
import json
import os

import regex as re

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer")
PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


# Verbatim from GPT-2's encoder.py.
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    cs = [chr(n) for n in cs]
    return dict(zip(bs, cs))


def get_pairs(word):
    return set(zip(word, word[1:]))


# GPT-2's Encoder.bpe (without its cache).
def bpe(token, bpe_ranks):
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return [token]
    while True:
        bigram = min(pairs, key=lambda pair: bpe_ranks.get(pair, float("inf")))
        if bigram not in bpe_ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)


def encode(text, encoder, bpe_ranks, byte_encoder):
    ids = []
    for i, part in enumerate(text.split("<|endoftext|>")):
        if i > 0:
            ids.append(encoder["<|endoftext|>"])
        for token in re.findall(PAT, part):
            token = "".join(byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(encoder[t] for t in bpe(token, bpe_ranks))
    return ids


SAMPLES = [
    "Hello world's  end\n\nok 123abc !!?",
    "I'm sure they'll say we've 're 'd 'S 'LL don't",
    "I'd you're he's it'd we'll they've",
    "  leading spaces\tand\ttabs \n trailing   ",
    "café naïve Ünïcödé résumé",
    "日本語のテキスト、テスト。",
    "emoji 😀👍🏽 x😀y ",
    "numbers 3.14159 1,000,000 ²³ ½",
    "mixed__under_score a-b c/d (e) [f] {g} <|x|>",
    "non\u00a0breaking\u3000space and\u2009thin",
    "line1\r\nline2\r\n\r\n",
    "e\u0301 combining",
    "'''quoted''' ''s",
    "Привет мир, Ελληνικά",
    "x     y",
    " ",
    "   ",
    "\n",
    "tab\t\t\tx",
    "--==** ascii-art ||| \\\\// ~~~",
    "$100 #1 @home 50% a+b=c",
]


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = [{"text": s, "words": re.findall(PAT, s)} for s in SAMPLES]
    with open(os.path.join(OUT, "pretokenize.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")

    byte_encoder = bytes_to_unicode()
    encoder = {tok: i for i, tok in enumerate(byte_encoder.values())}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "s"), ("Ġt", "h")]
    for a, b in merges:
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    # Sorted keys: the reader must not depend on the order of the object.
    with open(os.path.join(OUT, "tiny_encoder.json"), "w", encoding="utf-8") as f:
        json.dump(dict(sorted(encoder.items())), f)
        f.write("\n")
    with open(os.path.join(OUT, "tiny_vocab.bpe"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")

    bpe_ranks = {m: r for r, m in enumerate(merges)}
    texts = ["the the this<|endoftext|>!\n", " t", "this is the thesis", "caf\u00e9 \U0001F600", "  the\n\nthe"]
    expected = [{"text": t, "ids": encode(t, encoder, bpe_ranks, byte_encoder)} for t in texts]
    with open(os.path.join(OUT, "tiny_expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
