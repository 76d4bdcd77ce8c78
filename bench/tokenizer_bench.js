// JavaScript side of the tokenizer throughput benchmark: times @lenml/tokenizers (and, for
// context, Hugging Face tokenizers' Node binding) on the documents written by
//   tokenizer_bench --model DIR --write-docs DOCS.jsonl
// Usage: node bench/tokenizer_bench.js TOKENIZER_DIR DOCS.jsonl [passes]
// Needs `npm ci` in tests/peers/js. The checksum must equal the C++ one (same ids).
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const peerRequire = createRequire(path.join(__dirname, "..", "tests", "peers", "js", "package.json"));

function checksum(ids, h) {
  // FNV-1a over 32-bit ids, 64-bit, as the C++ bench.
  for (const id of ids) h = BigInt.asUintN(64, (h ^ BigInt(id >>> 0)) * 1099511628211n);
  return h;
}

async function main() {
  const [dir, docsPath, passesArg] = process.argv.slice(2);
  if (!dir || !docsPath) {
    console.error("usage: node tokenizer_bench.js TOKENIZER_DIR DOCS.jsonl [passes]");
    process.exit(2);
  }
  const passes = Math.max(2, Number(passesArg ?? 4));
  const docs = fs.readFileSync(docsPath, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);
  const mb = bytes / 1e6;

  const { TokenizerLoader } = peerRequire("@lenml/tokenizers");
  const t0 = process.hrtime.bigint();
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfg = path.join(dir, "tokenizer_config.json");
  const tokenizerConfig = fs.existsSync(cfg) ? JSON.parse(fs.readFileSync(cfg, "utf8")) : {};
  const lenml = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  console.log(`load: ${(Number(process.hrtime.bigint() - t0) / 1e9).toFixed(3)} s; ${docs.length} documents, ${mb.toFixed(2)} MB`);

  let cold = 0, warm = Infinity, sum = 0n, tokens = 0;
  for (let p = 0; p < passes; p++) {
    let h = 1469598103934665603n, n = 0;
    const a = process.hrtime.bigint();
    const all = [];
    for (const d of docs) all.push(lenml.encode(d, { add_special_tokens: false }));
    const s = Number(process.hrtime.bigint() - a) / 1e9;
    for (const ids of all) { h = checksum(ids, h); n += ids.length; }
    if (p === 0) { cold = s; sum = h; tokens = n; } else warm = Math.min(warm, s);
  }
  console.log(`tokens: ${tokens}  checksum: ${sum.toString(16).padStart(16, "0")}`);
  console.log(`@lenml/tokenizers encode: cold ${(mb / cold).toFixed(1)} MB/s, warm ${(mb / warm).toFixed(1)} MB/s`);

  try {
    const { Tokenizer } = peerRequire("tokenizers");
    const hf = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
    let best = Infinity, hsum = 1469598103934665603n;
    for (let p = 0; p < passes; p++) {
      const a = process.hrtime.bigint();
      const encs = [];
      for (const d of docs) encs.push(await hf.encode(d, null, { addSpecialTokens: false }));
      const s = Number(process.hrtime.bigint() - a) / 1e9;
      if (p === 0) for (const e of encs) hsum = checksum(e.getIds(), hsum);
      best = Math.min(best, s);
    }
    console.log(`Hugging Face tokenizers (Node binding, one encode call per document): best ${(mb / best).toFixed(1)} MB/s, ` +
      `checksum ${hsum.toString(16).padStart(16, "0")}`);
  } catch (e) {
    console.log(`Hugging Face tokenizers not timed (${String(e.message).split("\n")[0]})`);
  }
}

main();
