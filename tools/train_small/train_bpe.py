#!/usr/bin/env python3
"""Trains a byte-level BPE on the Brown training text and writes it as a Hugging Face tokenizer.json
in the form of DeepSeek's (the same pre-tokenizer regexes, ByteLevel alphabet, added special tokens),
so that DeepInfer's C++ tokenizer loads it. Then tokenizes the corpus for training.

Ids: 0 BOS, 1 EOS, 2 pad (as DeepSeek), then the 256 byte symbols, then the merges, and the last 8
ids are the chat/placeholder special tokens (as tests/data/golden_dev/model/tokenizer.json lays them
out; `</think>` is the DSpark noise token).

Output (--out): tokenizer.json, tokenizer_config.json, train_ids.npy / val_ids.npy (uint16 token
streams, each document followed by EOS) and val_docs.json (document start offsets in val_ids).
"""
import argparse
import heapq
import json
import os
from collections import Counter, defaultdict

import numpy as np
import regex

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
TAIL_SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<think>", "</think>", "<｜latest_reminder｜>",
                 "<｜place▁holder▁no▁0｜>", "<｜place▁holder▁no▁1｜>"]
SPLIT_PATTERNS = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_COMPILED = [regex.compile(p) for p in SPLIT_PATTERNS]


def bytes_to_unicode():
    """The GPT-2 / ByteLevel alphabet: printable bytes stand for themselves, the rest map above 255."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHAR = bytes_to_unicode()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def split_isolated(pieces, pattern):
    out = []
    for p in pieces:
        pos = 0
        for m in pattern.finditer(p):
            if m.start() > pos:
                out.append(p[pos:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = m.end()
        if pos < len(p):
            out.append(p[pos:])
    return out


def pretokenize(text):
    pieces = [text]
    for pat in _COMPILED:
        pieces = split_isolated(pieces, pat)
    return ["".join(BYTE_CHAR[b] for b in p.encode("utf-8")) for p in pieces]


def train_merges(word_counts, n_merges):
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    pair_count = Counter()
    pair_words = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += counts[i]
            pair_words[(a, b)].add(i)
    # max-heap on (count, then the smaller pair), lazily refreshed
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        c, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -c or c == 0:
            continue
        merges.append(pair)
        a, b = pair
        new = a + b
        changed = Counter()
        for i in list(pair_words[pair]):
            w = words[i]
            j, out = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            if out == w:
                continue
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= counts[i]
                changed[(x, y)] += 1
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += counts[i]
                pair_words[(x, y)].add(i)
                changed[(x, y)] += 1
            words[i] = out
        del pair_count[pair]
        for p in changed:
            if p in pair_count and pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return merges


class Bpe:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.cache = {}

    def word_ids(self, word):
        ids = self.cache.get(word)
        if ids is not None:
            return ids
        syms = list(word)
        while len(syms) > 1:
            best, at = None, -1
            for k in range(len(syms) - 1):
                r = self.ranks.get((syms[k], syms[k + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, k
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        ids = [self.vocab[s] for s in syms]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        out = []
        for w in pretokenize(text):
            out.extend(self.word_ids(w))
        return out


def tokenizer_json(vocab, merges, specials):
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for s, i in specials]
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in SPLIT_PATTERNS
    ] + [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [[a, b] for a, b in merges]}}


TOKENIZER_CONFIG = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
                    "pad_token": PAD, "clean_up_tokenization_spaces": False, "legacy": True,
                    "model_max_length": 1048576, "tokenizer_class": "LlamaTokenizerFast", "unk_token": None}


def load_docs(path):
    return [json.loads(line) for line in open(path)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="out/train_small", help="prepare_corpus.py output")
    ap.add_argument("--out", default="out/train_small")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args()
    train_docs = load_docs(os.path.join(args.data, "brown_train.jsonl"))
    val_docs = load_docs(os.path.join(args.data, "brown_val.jsonl"))
    word_counts = Counter()
    for d in train_docs:
        word_counts.update(pretokenize(d["text"]))
    n_base = 3 + 256
    n_merges = args.vocab_size - n_base - len(TAIL_SPECIALS)
    merges = train_merges(word_counts, n_merges)
    vocab = {BOS: 0, EOS: 1, PAD: 2}
    for ch in sorted(BYTE_CHAR.values()):
        vocab[ch] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    first_tail = len(vocab)
    specials = [(BOS, 0), (EOS, 1), (PAD, 2)] + [(s, first_tail + i) for i, s in enumerate(TAIL_SPECIALS)]
    os.makedirs(args.out, exist_ok=True)
    json.dump(tokenizer_json(vocab, merges, specials), open(os.path.join(args.out, "tokenizer.json"), "w"),
              ensure_ascii=False)
    json.dump(TOKENIZER_CONFIG, open(os.path.join(args.out, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=2)
    bpe = Bpe(vocab, merges)
    for name, docs in (("train", train_docs), ("val", val_docs)):
        stream, starts = [], []
        for d in docs:
            starts.append(len(stream))
            stream.extend(bpe.encode(d["text"]))
            stream.append(1)
        np.save(os.path.join(args.out, f"{name}_ids.npy"), np.array(stream, dtype=np.uint16))
        if name == "val":
            json.dump({"starts": starts, "docs": [d["doc"] for d in docs]}, open(os.path.join(args.out, "val_docs.json"), "w"))
        print(f"{name}: {len(docs)} docs, {len(stream)} tokens, "
              f"{sum(len(d['text']) for d in docs) / len(stream):.2f} chars/token")
    print(f"vocab {first_tail + len(TAIL_SPECIALS)} ({len(merges)} merges); noise token </think> = "
          f"{first_tail + TAIL_SPECIALS.index('</think>')}")


if __name__ == "__main__":
    main()
