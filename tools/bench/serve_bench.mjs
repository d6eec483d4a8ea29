#!/usr/bin/env node
// Throughput and latency of a running `nextn serve` at several concurrency levels, with and without
// speculation (the same greedy requests; `num_speculative_tokens: 0` turns speculation off per request).
// Node's own fetch only; loopback. Prints a markdown table (and --json FILE writes the numbers).
//
//   node tools/bench/serve_bench.mjs --url http://127.0.0.1:8000 [--concurrency 1,8,32,64]
//        [--requests-per-client 4] [--max-tokens 96] [--json out.json]
//
// Per level: C clients each send R streaming completions back to back (C x R requests in all).
// throughput = completion tokens / wall time of the level; TTFT = first content chunk - send;
// ITL = gaps between a stream's chunks (a speculative round delivers several tokens in one chunk, as
// vLLM's benchmark counts it); TPOT = (last chunk - first chunk) / (tokens - 1) per request.
// steady throughput = the tokens streamed while every client is still busy (up to the moment the first
// client has its last reply) / that time: the level without its drain, when the clients that finished
// early leave the server a smaller batch (speculation's requests finish apart; plain greedy ones of one
// length, sent together, finish together, so their drain is shorter).
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const url = args.url ?? 'http://127.0.0.1:8000';
const levels = (args.concurrency ?? '1,8,32,64').split(',').map(Number);
const perClient = Number(args['requests-per-client'] ?? 4);
const maxTokens = Number(args['max-tokens'] ?? 96);
// --repeat N: each level runs off, on, on, off, off, on, ... (N of each), and the table gives each mode's run of
// median throughput (on a shared 2-core machine one run's throughput varies by 10% or more), and as the
// ratio the median over the N pairs (off, on) run back to back of on / off: a machine whose speed drifts
// between runs (a 2-vCPU VM swung 1.0-1.8k tok/s within minutes) moves both runs of a pair together.
const repeat = Number(args.repeat ?? 1);
const specK = args['spec-k'] === undefined ? undefined : Number(args['spec-k']);  // fixed k instead of the tuned
// --control: the "on" runs send plain requests as well (an A/A control): the spread of the pairs' ratios is then
// the machine's own, the noise an on / off ratio has to be read against.
const control = 'control' in args;

// Python openings the bundled models continue (they were trained on Python code).
const prompts = [
  'import os\n\n\ndef read_lines(path):\n    """Return the lines of a text file."""\n',
  'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n',
  'def fibonacci(n):\n    if n < 2:\n        return n\n',
  'import json\n\n\ndef load_config(path):\n',
  'def merge_sort(values):\n    if len(values) <= 1:\n        return values\n',
  'from collections import defaultdict\n\n\ndef group_by(items, key):\n',
  'def parse_args():\n    import argparse\n    parser = argparse.ArgumentParser()\n',
  'class Node:\n    def __init__(self, value, next=None):\n',
];

async function one(prompt, on) {
  const spec = on && !control;
  const body = { prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true,
                 return_token_ids: true, ...(spec ? (specK === undefined ? {} : { num_speculative_tokens: specK })
                                                 : { num_speculative_tokens: 0 }) };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, { method: 'POST', body: JSON.stringify(body),
                                                      headers: { 'content-type': 'application/json' } });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = '', tokens = 0, first = 0, last = 0, stats = null;
  const gaps = [], arrivals = [];  // arrivals: [time, tokens] per chunk
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.choices?.[0]?.nextn) stats = chunk.choices[0].nextn;
      const n = chunk.choices?.[0]?.token_ids?.length ?? 0;
      if (!n) continue;
      const now = performance.now();
      if (!first) first = now; else gaps.push((now - last) / 1000);
      last = now;
      tokens += n;
      arrivals.push([now, n]);
    }
  }
  return { tokens, ttft: (first - t0) / 1000, tpot: tokens > 1 ? (last - first) / 1000 / (tokens - 1) : 0, gaps, stats,
           arrivals };
}

const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : 0; };
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);

async function level(c, spec) {
  const results = [];
  const t0 = performance.now();
  let firstDone = Infinity;  // when the first client had its last reply
  await Promise.all(Array.from({ length: c }, async (_, i) => {
    for (let r = 0; r < perClient; ++r) results.push(await one(prompts[(i + r) % prompts.length], spec));
    firstDone = Math.min(firstDone, performance.now());
  }));
  const wall = (performance.now() - t0) / 1000;
  const tokens = results.reduce((a, r) => a + r.tokens, 0);
  const steadyTokens = results.reduce(
    (a, r) => a + r.arrivals.reduce((b, [t, n]) => b + (t <= firstDone ? n : 0), 0), 0);
  const roundsAtK = [];  // what the k tuner chose, over the level's requests
  for (const r of results)
    (r.stats?.rounds_at_k ?? []).forEach((n, k) => { roundsAtK[k] = (roundsAtK[k] ?? 0) + n; });
  return { concurrency: c, speculation: spec, requests: results.length, tokens, wall_s: wall,
           tokens_per_s: tokens / wall, steady_tokens_per_s: steadyTokens / ((firstDone - t0) / 1000),
           ttft_p50_s: pct(results.map((r) => r.ttft), 0.5),
           ttft_p95_s: pct(results.map((r) => r.ttft), 0.95), tpot_mean_s: mean(results.map((r) => r.tpot)),
           itl_p50_s: pct(results.flatMap((r) => r.gaps), 0.5), itl_p95_s: pct(results.flatMap((r) => r.gaps), 0.95),
           rounds_at_k: Array.from(roundsAtK, (n) => n ?? 0) };
}

const rows = [];
await one(prompts[0], true);  // warm-up (first-touch of weights and pages, the k tuner's first probes)
for (const c of levels) {
  const runs = { false: [], true: [] };
  for (let i = 0; i < repeat; ++i)  // (pairs alternate which mode runs first, so a drift favours neither)
    for (const spec of i % 2 ? [true, false] : [false, true]) runs[spec].push(await level(c, spec));
  const pairRatios = runs[true].map((on, i) => on.tokens_per_s / runs[false][i].tokens_per_s);
  const steadyRatios = runs[true].map((on, i) => on.steady_tokens_per_s / runs[false][i].steady_tokens_per_s);
  for (const spec of [false, true]) {
    const sorted = [...runs[spec]].sort((a, b) => a.tokens_per_s - b.tokens_per_s);
    rows.push({ ...sorted[Math.floor(sorted.length / 2)], all_tokens_per_s: sorted.map((x) => x.tokens_per_s),
                steady_tokens_per_s_median: pct(runs[spec].map((x) => x.steady_tokens_per_s), 0.5),
                ...(spec ? { pair_ratios: pairRatios, pair_ratio_median: pct(pairRatios, 0.5),
                             steady_pair_ratios: steadyRatios, steady_pair_ratio_median: pct(steadyRatios, 0.5) }
                         : {}) });
    const r = rows.at(-1);
    console.error(`c=${c} ${spec ? 'spec' : 'plain'}: ${r.all_tokens_per_s.map((x) => x.toFixed(1)).join(' / ')} tok/s, ` +
                  `TTFT p50 ${(r.ttft_p50_s * 1e3).toFixed(1)} ms` +
                  (r.rounds_at_k.length ? `, rounds per k ${r.rounds_at_k.join(' ')}` : '') +
                  (spec ? `; on / off per pair: ${[...pairRatios].sort((a, b) => a - b).map((x) => x.toFixed(2))
                                                     .join(' ')}; steady: ${[...steadyRatios].sort((a, b) => a - b)
                                                     .map((x) => x.toFixed(2)).join(' ')}` : ''));
  }
}
const ms = (s) => (s * 1000).toFixed(1);
if (repeat > 1) console.log('(tokens/s: the median run of each mode; ratio: the median over the pairs of on / off)');
console.log('| clients | speculation | requests | tokens/s | ratio | steady tokens/s | steady ratio | ' +
            'TTFT p50 / p95 ms | ITL p50 / p95 ms | TPOT ms |');
console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|');
for (const r of rows) {
  const plain = rows.find((x) => x.concurrency === r.concurrency && !x.speculation);
  const ratio = r.speculation && r.pair_ratios.length > 1 ? r.pair_ratio_median : r.tokens_per_s / plain.tokens_per_s;
  const steadyRatio = r.speculation && r.pair_ratios.length > 1
    ? r.steady_pair_ratio_median : r.steady_tokens_per_s_median / plain.steady_tokens_per_s_median;
  const mode = !r.speculation ? 'off' : control ? 'off (A/A control)'
    : specK === undefined ? 'MTP (server default)' : `MTP k = ${specK}`;
  console.log(`| ${r.concurrency} | ${mode} | ${r.requests} | ` +
              `${r.tokens_per_s.toFixed(1)} | ${ratio.toFixed(2)}x | ` +
              `${r.steady_tokens_per_s_median.toFixed(1)} | ${steadyRatio.toFixed(2)}x | ` +
              `${ms(r.ttft_p50_s)} / ${ms(r.ttft_p95_s)} | ${ms(r.itl_p50_s)} / ${ms(r.itl_p95_s)} | ${ms(r.tpot_mean_s)} |`);
}
if (args.json) (await import('node:fs')).writeFileSync(args.json, JSON.stringify(rows, null, 2));
