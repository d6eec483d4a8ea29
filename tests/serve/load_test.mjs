// A bounded load test of `nextn serve` on loopback (docs/server.md): many concurrent streaming clients, then
// the same with clients that abort mid-stream and a stream of malformed requests, with strict checks of every
// stream, of the server's memory and of its state afterwards. Exits non-zero on any failure.
//
//   node tests/serve/load_test.mjs
//
// Environment (defaults in brackets):
//   NEXTN_CLI                   the nextn binary [build/bin/nextn]
//   NEXTN_LOAD_REQUESTS         streaming requests in each of the two phases [256]
//   NEXTN_LOAD_CONCURRENCY      concurrent clients [64]
//   NEXTN_LOAD_MAX_TOKENS       largest max_tokens of a request [24]
//   NEXTN_LOAD_SCALE            < 1 scales requests and clients down (sanitizer builds: 0.25) [1]
//   NEXTN_LOAD_KV_MB            --kv-cache-mb of the server [256]
//   NEXTN_LOAD_RSS_MARGIN_MB    allowed RSS growth over the warm-up's steady-state peak [96; 512 scaled down]
//   NEXTN_LOAD_ABS_MARGIN_MB    RSS may never pass RSS-when-ready + the KV pool + this [192; 1024 scaled down]
//   NEXTN_LOAD_ABORT_SHARE      share of phase-2 clients that abort mid-stream [0.2]
//   NEXTN_LOAD_MALFORMED        malformed requests mixed into phase 2 [96]
//   NEXTN_LOAD_CHAT_SHARE       share of requests to /v1/chat/completions (the rest: /v1/completions) [0.4]
//
// Memory: the KV cache is one pool allocated up front (--kv-cache-mb) whose pages become resident as they are
// first written, and the server's workspaces grow to the largest batch and longest context seen (on the
// bundled model the idle RSS rises by about 100 MiB over the first ~700 requests of this mix, whatever the
// pool size, then stays flat). So the warm-up runs rounds of the phase-2 mix (short requests, long ones
// that leave mid-stream, malformed requests) at full concurrency until two rounds in a row grow the idle
// RSS by less than 4 MiB each; the highest RSS sampled in those two rounds is the baseline. The server's
// RSS, sampled every 50 ms through both phases, must stay under baseline + NEXTN_LOAD_RSS_MARGIN_MB (96 MiB:
// a workspace still grows in steps of ~40 MiB when a batch larger than any before comes along, and one
// such step may still come after the warm-up); growth past that is a leak, per request or per cancelled
// stream.
import net from 'node:net';
import {
  startServer, rssBytes, fetchMetrics, metricValue, readSSE, waitFor, chatTemplateArgs, SLOWDOWN,
} from './lib/server.mjs';

const env = (k, d) => (process.env[k] === undefined || process.env[k] === '' ? d : Number(process.env[k]));
const SCALE = Math.min(1, env('NEXTN_LOAD_SCALE', 1));
const REQUESTS = Math.max(8, Math.round(env('NEXTN_LOAD_REQUESTS', 256) * SCALE));
const CONCURRENCY = Math.max(4, Math.round(env('NEXTN_LOAD_CONCURRENCY', 64) * SCALE));
const MAX_TOKENS = env('NEXTN_LOAD_MAX_TOKENS', 24);
const KV_MB = env('NEXTN_LOAD_KV_MB', 256);
// Scaled down (sanitizer builds): AddressSanitizer's quarantine (256 MiB) and shadow memory make RSS grow
// without a leak, so the margin is wide there; LeakSanitizer checks leaks at the server's exit instead.
const RSS_MARGIN = env('NEXTN_LOAD_RSS_MARGIN_MB', SCALE < 1 ? 512 : 96) * 1024 * 1024;
// The absolute bound (the issue's): RSS when the server was ready + the whole KV pool + this margin (the
// workspaces for the largest batch, HTTP thread stacks, the allocator's caches).
const ABS_MARGIN = env('NEXTN_LOAD_ABS_MARGIN_MB', SCALE < 1 ? 1024 : 192) * 1024 * 1024;
const ABORT_SHARE = env('NEXTN_LOAD_ABORT_SHARE', 0.2);
const MALFORMED = Math.max(12, Math.round(env('NEXTN_LOAD_MALFORMED', 96) * SCALE));
const CHAT_SHARE = env('NEXTN_LOAD_CHAT_SHARE', 0.4);
const MAX_BODY_KB = 64;
const WARM_ROUND = 2 * CONCURRENCY;
const WARM_STEADY = 4 * 1024 * 1024;
// Scaled down (sanitizer builds) RSS never settles (ASan's quarantine keeps freed memory), so two rounds do.
const WARM_MAX_ROUNDS = SCALE < 1 ? 2 : 10;
const DEADLINE_MS = 15 * 60_000 * SLOWDOWN;  // the whole run; it then fails rather than hangs
const REQUEST_TIMEOUT_MS = 180_000 * SLOWDOWN;

const failures = [];
const errText = (e) => `${e.message}${e.cause ? ` (${e.cause.code ?? e.cause.message})` : ''}`;
const fail = (what) => {
  failures.push(what);
  if (failures.length <= 20) console.error(`FAIL: ${what}`);
};

// Deterministic pseudo-random choices (the run is the same every time).
let seed = 12345;
const rand = () => {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff;
  return seed / 0x80000000;
};
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

const CODE = `import os
import sys
from collections import defaultdict


def read_lines(path):
    with open(path) as f:
        return [line.rstrip("\\n") for line in f]


class Counter:
    def __init__(self):
        self.counts = defaultdict(int)

    def add(self, key):
        self.counts[key] += 1

    def most_common(self, n=10):
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]
`;
const PROMPTS = ['def fibonacci(n):', 'import os\n', 'class Stack:\n    def __init__(self):', '# quicksort\n',
  CODE, CODE.slice(0, 200), CODE.slice(100, 500), 'x = [', 'for i in range(10):\n'];

function percentile(xs, p) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

// One streaming request, checked strictly. abortAfter: abort after that many chunks (a client that leaves).
async function streamRequest(server, { chat, body, abortAfter }) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(new Error('request timed out')), REQUEST_TIMEOUT_MS);
  const t0 = performance.now();
  let ttft;
  let chunkCount = 0;
  const result = { ok: false, aborted: false, tokens: 0, ttft: undefined };
  try {
    const res = await fetch(`${server.baseURL}${chat ? '/v1/chat/completions' : '/v1/completions'}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: ctrl.signal,
    });
    if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
    const { chunks } = await readSSE(res, {
      onChunk: (c) => {
        chunkCount++;
        if (ttft === undefined && c.choices?.some((ch) => (chat ? ch.delta?.content : ch.text))) ttft = performance.now() - t0;
        if (abortAfter !== undefined && chunkCount >= abortAfter) {
          result.aborted = true;
          ctrl.abort();
        }
      },
    });
    checkStream(chunks, { chat, body });
    const usage = chunks[chunks.length - 1].usage;
    result.tokens = usage.completion_tokens;
    result.ttft = ttft;
    result.ok = true;
  } catch (e) {
    if (result.aborted && (e.name === 'AbortError' || ctrl.signal.aborted)) {
      result.ok = true;  // it left on purpose
    } else {
      fail(`${chat ? 'chat' : 'completions'} ${JSON.stringify(body).slice(0, 160)}: ${errText(e)}`);
    }
  } finally {
    clearTimeout(timer);
  }
  return result;
}

function checkStream(chunks, { chat, body }) {
  const n = body.n ?? 1;
  if (chunks.length < 2) throw new Error(`only ${chunks.length} chunks`);
  const id = chunks[0].id;
  if (!new RegExp(chat ? '^chatcmpl-' : '^cmpl-').test(id)) throw new Error(`id ${id}`);
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const finishes = new Array(n).fill(0);
  const seen = new Array(n).fill(0);
  chunks.forEach((c, i) => {
    if (c.id !== id) throw new Error(`chunk ${i} id ${c.id} != ${id}`);
    if (c.object !== object) throw new Error(`chunk ${i} object ${c.object}`);
    if (c.created !== chunks[0].created) throw new Error(`chunk ${i} created changes`);
    if (!Array.isArray(c.choices)) throw new Error(`chunk ${i} without choices`);
    if (c.choices.length === 0) {
      if (i !== chunks.length - 1) throw new Error(`usage chunk ${i} is not last`);
      return;
    }
    for (const ch of c.choices) {
      if (!(ch.index >= 0 && ch.index < n)) throw new Error(`chunk ${i} choice index ${ch.index}`);
      if (finishes[ch.index]) throw new Error(`choice ${ch.index}: chunk after its finish_reason`);
      if (chat && seen[ch.index] === 0 && ch.delta?.role !== 'assistant') throw new Error(`choice ${ch.index}: first delta without role`);
      if (!chat && typeof ch.text !== 'string') throw new Error(`chunk ${i}: text is not a string`);
      seen[ch.index]++;
      if (ch.finish_reason != null) {
        if (!['stop', 'length'].includes(ch.finish_reason)) throw new Error(`finish_reason ${ch.finish_reason}`);
        if (!(ch.nextn ?? c.nextn)) throw new Error(`choice ${ch.index}: last chunk without nextn`);
        finishes[ch.index]++;
      }
    }
  });
  finishes.forEach((f, k) => { if (f !== 1) throw new Error(`choice ${k}: ${f} finish_reasons`); });
  const last = chunks[chunks.length - 1];
  if (!(last.choices.length === 0 && last.usage && last.nextn)) throw new Error('no final usage chunk with nextn');
  const u = last.usage;
  if (u.total_tokens !== u.prompt_tokens + u.completion_tokens) throw new Error(`usage ${JSON.stringify(u)}`);
  if (body.ignore_eos && u.completion_tokens !== n * body.max_tokens) {
    throw new Error(`ignore_eos: ${u.completion_tokens} tokens, asked ${n} x ${body.max_tokens}`);
  }
}

function randomRequest({ long = false } = {}) {
  const chat = rand() < CHAT_SHARE;
  const body = {
    max_tokens: long ? 200 + Math.floor(rand() * 200) : 1 + Math.floor(rand() * MAX_TOKENS),
    temperature: pick([0, 0, 0.8]),
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  };
  const k = pick([undefined, 0, 1, 3]);
  if (k !== undefined) body.num_speculative_tokens = k;
  if (body.temperature > 0) body.seed = Math.floor(rand() * 1e6);
  if (chat) body.messages = [{ role: 'user', content: pick(PROMPTS) }];
  else body.prompt = pick(PROMPTS);
  return { chat, body };
}

// A phase-2 client: ABORT_SHARE of them ask for a long reply and leave after a few chunks.
async function phase2Request(server) {
  const leave = rand() < ABORT_SHARE;
  const req = randomRequest({ long: leave });
  const r = await streamRequest(server, { ...req, abortAfter: leave ? 2 + Math.floor(rand() * 6) : undefined });
  return { ...r, leaving: leave };
}

// Runs `count` jobs with `concurrency` workers.
async function pool(count, concurrency, job) {
  let next = 0;
  const results = [];
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, async () => {
    while (next < count) {
      const i = next++;
      results[i] = await job(i);
    }
  }));
  return results;
}

// Malformed requests: each must get exactly its status and an OpenAI error body; garbage on a raw socket
// must get a 4xx answer or a closed connection, never a crash.
async function malformed(server, i, model) {
  const kinds = ['json', 'type', 'huge', 'model', 'oversize', 'garbage', 'truncated', 'badpath'];
  const kind = kinds[i % kinds.length];
  const post = async (body, want, path = '/v1/completions') => {
    const r = await fetch(`${server.baseURL}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const text = await r.text();
    if (r.status !== want) throw new Error(`${kind}: status ${r.status} (want ${want}): ${text.slice(0, 200)}`);
    let j;
    try {
      j = JSON.parse(text);
    } catch {
      throw new Error(`${kind}: error body is not JSON: ${text.slice(0, 200)}`);
    }
    if (typeof j?.error?.message !== 'string') throw new Error(`${kind}: not an OpenAI error body: ${text.slice(0, 200)}`);
  };
  try {
    switch (kind) {
      case 'json': return await post('{"prompt": "x", "max_tokens": ', 400);
      case 'type': return await post(JSON.stringify({ prompt: 'x', max_tokens: 'many', stream: true }), 400, '/v1/completions');
      case 'huge': return await post(JSON.stringify({ prompt: 'x', max_tokens: 1e9, stream: true }), 400);
      case 'model': return await post(JSON.stringify({ model: `${model}-nope`, messages: [{ role: 'user', content: 'x' }], stream: true }), 404, '/v1/chat/completions');
      case 'oversize': return await post(JSON.stringify({ prompt: 'y'.repeat((MAX_BODY_KB + 1) * 1024) }), 413);
      case 'badpath': return await post('{}', 404, '/v1/nothing-here');
      case 'garbage':
      case 'truncated': {
        const u = new URL(server.baseURL);
        const payload = kind === 'garbage'
          ? Buffer.from(Array.from({ length: 512 }, () => Math.floor(rand() * 256)))
          : Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
            'Content-Length: 1000\r\n\r\n{"prompt": "abc", ');
        const answer = await new Promise((resolve, reject) => {
          const sock = net.connect(Number(u.port), u.hostname);
          let got = '';
          const timer = setTimeout(() => { sock.destroy(); reject(new Error(`${kind}: no answer and no close in 30 s`)); },
            30_000 * SLOWDOWN);
          sock.on('connect', () => {
            sock.write(payload);
            if (kind === 'truncated') sock.end();  // half-close: the body never completes
          });
          sock.on('data', (d) => { got += d.toString('latin1'); });
          sock.on('error', () => {});  // a reset is an acceptable answer to garbage
          sock.on('close', () => { clearTimeout(timer); resolve(got); });
        });
        if (answer && !/^HTTP\/1\.[01] [45]\d\d /.test(answer)) throw new Error(`${kind}: answered ${JSON.stringify(answer.slice(0, 80))}`);
        return undefined;
      }
      default: throw new Error(kind);
    }
  } catch (e) {
    fail(`malformed ${kind}: ${errText(e)}`);
    return undefined;
  }
}

async function main() {
  const deadline = setTimeout(() => {
    console.error(`FAIL: the load test did not finish within ${DEADLINE_MS / 1000} s`);
    process.exit(1);  // the exit hook of lib/server.mjs kills the server
  }, DEADLINE_MS);
  console.log(`load test: ${REQUESTS} streaming requests a phase, ${CONCURRENCY} concurrent clients, max_tokens <= ` +
    `${MAX_TOKENS}, --kv-cache-mb ${KV_MB}, RSS margin ${RSS_MARGIN >> 20} MiB, scale ${SCALE}`);
  const server = await startServer({
    args: ['--kv-cache-mb', String(KV_MB), '--max-queue', String(4 * CONCURRENCY + MALFORMED),
      '--max-body-kb', String(MAX_BODY_KB), ...chatTemplateArgs()],
  });
  const rssSamples = [];
  let sampler;
  try {
    const readyRss = rssBytes(server.pid);
    const absBound = readyRss + KV_MB * 2 ** 20 + ABS_MARGIN;
    const probe = { prompt: PROMPTS[4], max_tokens: 16, temperature: 0, logprobs: 1 };
    const probeRes = await (await fetch(`${server.baseURL}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(probe),
    })).json();
    if (!probeRes.choices) throw new Error(`probe request failed: ${JSON.stringify(probeRes)}`);

    // Warm-up to a steady state: rounds of the phase-2 mix (short requests, long ones that leave early, some
    // malformed requests) at full concurrency until two rounds in a row grow the idle RSS by less than
    // WARM_STEADY each (at most WARM_MAX_ROUNDS), so that the largest batches, the longest sequences and the
    // most pages in use at once have been seen. The baseline is the highest RSS sampled during those last two
    // rounds: the steady state's peak, not its idle RSS (a round's long sequences hold buffers while they run).
    let samples = [];
    sampler = setInterval(() => {
      try {
        samples.push(rssBytes(server.pid));
      } catch {
        // the server is gone: the requests fail and say so
      }
    }, 50);
    const tw = performance.now();
    const idleRss = async () => {
      await waitFor(async () => metricValue(await fetchMetrics(server.baseURL), 'vllm:num_requests_running') === 0,
        { what: 'idle after a warm-up round' });
      return rssBytes(server.pid);
    };
    let rounds = 0;
    let steady = 0;  // rounds in a row that grew the idle RSS by less than WARM_STEADY
    let idleBefore = rssBytes(server.pid);
    const roundPeaks = [];
    const warmLog = [];
    for (;;) {
      samples = [];
      await Promise.all([
        pool(WARM_ROUND, CONCURRENCY, () => phase2Request(server)),
        pool(24, 4, (i) => malformed(server, i, server.model)),
      ]);
      rounds++;
      const now = await idleRss();
      roundPeaks.push(Math.max(now, ...samples));
      warmLog.push(`${(now / 2 ** 20).toFixed(0)}/${(roundPeaks[roundPeaks.length - 1] / 2 ** 20).toFixed(0)}`);
      steady = now - idleBefore < WARM_STEADY ? steady + 1 : 0;
      idleBefore = now;
      if (steady >= 2 || rounds >= WARM_MAX_ROUNDS) break;
    }
    const warmRequests = rounds * WARM_ROUND;
    const baseline = Math.max(...roundPeaks.slice(-2));
    const bound = baseline + RSS_MARGIN;
    console.log(`warm-up: ${rounds} rounds of ${WARM_ROUND} requests in ${((performance.now() - tw) / 1000).toFixed(1)} s; ` +
      `RSS idle/peak of each ${warmLog.join(', ')} MiB; baseline ${(baseline / 2 ** 20).toFixed(1)} MiB, bound ` +
      `${(bound / 2 ** 20).toFixed(1)} MiB`);
    samples = rssSamples;

    // Phase 1: every request streams to its end.
    const m0 = await fetchMetrics(server.baseURL);
    const t1 = performance.now();
    const p1 = await pool(REQUESTS, CONCURRENCY, () => streamRequest(server, randomRequest()));
    const wall1 = (performance.now() - t1) / 1000;
    const done1 = p1.filter((r) => r.ok);
    const tokens1 = done1.reduce((s, r) => s + r.tokens, 0);
    const ttfts = done1.map((r) => r.ttft).filter((x) => x !== undefined);
    const m1 = await fetchMetrics(server.baseURL);
    const delta = (a, b, name, where) => metricValue(b, name, where) - metricValue(a, name, where);
    const gen1 = delta(m0, m1, 'vllm:generation_tokens_total');
    if (gen1 !== tokens1) fail(`phase 1: vllm:generation_tokens_total grew by ${gen1}, the streams' usage sums to ${tokens1}`);
    const succ1 = delta(m0, m1, 'vllm:request_success_total', { finished_reason: 'length' }) +
      (delta(m0, m1, 'vllm:request_success_total', { finished_reason: 'stop' }) || 0);
    if (succ1 !== done1.length) fail(`phase 1: vllm:request_success_total grew by ${succ1}, ${done1.length} requests finished`);
    const peak1 = Math.max(...rssSamples);
    console.log(`phase 1: ${done1.length}/${REQUESTS} ok in ${wall1.toFixed(1)} s, ${tokens1} tokens ` +
      `(${(tokens1 / wall1).toFixed(0)} tokens/s), TTFT p50 ${percentile(ttfts, 50).toFixed(0)} ms p95 ` +
      `${percentile(ttfts, 95).toFixed(0)} ms, peak RSS ${(peak1 / 2 ** 20).toFixed(1)} MiB`);

    // Phase 2: 20% of the clients leave mid-stream; malformed requests arrive meanwhile.
    const t2 = performance.now();
    const [p2] = await Promise.all([
      pool(REQUESTS, CONCURRENCY, () => phase2Request(server)),
      pool(MALFORMED, 4, (i) => malformed(server, i, server.model)),
    ]);
    const wall2 = (performance.now() - t2) / 1000;
    const done2 = p2.filter((r) => r.ok);
    const aborted2 = p2.filter((r) => r.aborted).length;
    const aborts = p2.filter((r) => r.leaving).length;
    if (aborted2 !== aborts) fail(`phase 2: ${aborts} clients meant to leave, ${aborted2} did (the rest finished first)`);

    // Idle: every cancelled sequence is freed.
    const idle = await waitFor(async () => {
      const m = await fetchMetrics(server.baseURL);
      return metricValue(m, 'vllm:num_requests_running') === 0 && metricValue(m, 'vllm:num_requests_waiting') === 0 ? m : null;
    }, { what: '0 running and 0 waiting on /metrics after phase 2', timeoutMs: 60_000 * SLOWDOWN }).catch((e) => {
      fail(e.message);
      return null;
    });
    if (idle) {
      const kv = metricValue(idle, 'vllm:kv_cache_usage_perc');
      if (kv !== 0) fail(`idle after phase 2: vllm:kv_cache_usage_perc is ${kv}, not 0 (KV pages not freed)`);
    }
    const health = await fetch(`${server.baseURL}/health`);
    const hj = await health.json().catch(() => null);
    if (health.status !== 200 || hj?.status !== 'ok') fail(`/health after the load: ${health.status} ${JSON.stringify(hj)}`);
    // A final request still works, and gives what it gave before the load.
    const finalRes = await (await fetch(`${server.baseURL}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(probe),
    })).json();
    if (finalRes.choices?.[0]?.text !== probeRes.choices[0].text) {
      fail(`the final request differs from the same request before the load: ${JSON.stringify(finalRes).slice(0, 300)}`);
    } else if (JSON.stringify(finalRes.choices[0].logprobs.token_logprobs) !==
        JSON.stringify(probeRes.choices[0].logprobs.token_logprobs)) {
      fail('the final request\'s logprobs differ from before the load');
    }
    clearInterval(sampler);
    rssSamples.push(rssBytes(server.pid));
    const peak = Math.max(...rssSamples);
    if (peak > absBound) {
      fail(`server RSS peaked at ${(peak / 2 ** 20).toFixed(1)} MiB, over RSS when ready ${(readyRss / 2 ** 20).toFixed(1)} ` +
        `MiB + the KV pool ${KV_MB} MiB + ${ABS_MARGIN >> 20} MiB`);
    }
    if (peak > bound) {
      fail(`server RSS peaked at ${(peak / 2 ** 20).toFixed(1)} MiB, over the bound ${(bound / 2 ** 20).toFixed(1)} MiB ` +
        `(the warm-up's steady-state peak ${(baseline / 2 ** 20).toFixed(1)} MiB + ${RSS_MARGIN >> 20} MiB)`);
    }
    console.log(`phase 2: ${done2.length}/${REQUESTS} ok (${aborted2} left mid-stream) + ${MALFORMED} malformed in ` +
      `${wall2.toFixed(1)} s; idle afterwards: 0 running, 0 waiting; final request ok`);
    const ttftAll = [...ttfts, ...done2.map((r) => r.ttft).filter((x) => x !== undefined)];
    const lost = REQUESTS * 2 - done1.length - done2.length;
    console.log('summary:');
    console.log(`  requests        ${REQUESTS * 2} streaming (+${warmRequests} warm-up, ${MALFORMED} malformed), ` +
      `${lost} failed or lost, ${aborted2} aborted by the client on purpose`);
    console.log(`  TTFT            p50 ${percentile(ttftAll, 50).toFixed(0)} ms, p95 ${percentile(ttftAll, 95).toFixed(0)} ms`);
    console.log(`  throughput      ${(tokens1 / wall1).toFixed(0)} generated tokens/s (phase 1, ${CONCURRENCY} clients)`);
    console.log(`  RSS             warm-up steady-state peak ${(baseline / 2 ** 20).toFixed(1)} MiB, peak ${(peak / 2 ** 20).toFixed(1)} MiB, ` +
      `bound ${(bound / 2 ** 20).toFixed(1)} MiB; absolute bound ${(absBound / 2 ** 20).toFixed(1)} MiB (ready ` +
      `${(readyRss / 2 ** 20).toFixed(1)} + KV pool ${KV_MB} + ${ABS_MARGIN >> 20}) (${rssSamples.length} samples)`);
  } catch (e) {
    fail(`${e.stack ?? e}`);
  } finally {
    clearInterval(sampler);
    try {
      await server.stop({ expectExitCode: 0 });
    } catch (e) {
      fail(e.message);
    }
    clearTimeout(deadline);
  }
  if (failures.length) {
    console.error(`--- the server's stderr (last 4000 characters) ---\n${server.stderr().slice(-4000)}`);
    console.error(`load test FAILED: ${failures.length} failure(s)`);
    process.exit(1);
  }
  console.log('load test passed');
}

await main();
