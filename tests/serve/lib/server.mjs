// Starts `nextn serve` for a test and stops it again; small helpers the serve tests share.
//
//   const server = await startServer({ args: ['--max-body-kb', '64'] });
//   ... server.baseURL ('http://127.0.0.1:PORT'), server.model, server.process, server.stderr() ...
//   await server.stop({ expectExitCode: 0 });
//
// The binary is $NEXTN_CLI, else build/bin/nextn of this checkout. The server always gets `--port 0` (a free
// port chosen by the OS) and is ready when it prints `nextn serve: listening on http://HOST:PORT (model NAME)`
// on stderr. Every server started here is killed when the test process exits, however it exits: it runs
// under `setpriv --pdeathsig KILL` where util-linux has it (so a test runner killed by a timeout takes its
// servers with it), and an exit hook SIGKILLs any that are still running.
import { spawn, execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const TESTS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_ROOT = path.resolve(TESTS_DIR, '..', '..');
export const NEXTN_CLI = process.env.NEXTN_CLI
  ? path.resolve(process.env.NEXTN_CLI)
  : path.join(REPO_ROOT, 'build', 'bin', 'nextn');
export const DEFAULT_MODEL_DIR = path.join(REPO_ROOT, 'models', 'nextn-hy4-tiny');
// Sanitizer builds run several times slower: NEXTN_LOAD_SCALE < 1 (set by ctest there) stretches timeouts.
export const SLOWDOWN = (() => {
  const s = Number(process.env.NEXTN_LOAD_SCALE ?? '1');
  return s > 0 && s < 1 ? 1 / s : 1;
})();

const LISTENING = /nextn serve: listening on (http:\/\/[^\s]+) \(model (.+)\)/;
const STDERR_KEEP = 64 * 1024;
const SETPRIV = '/usr/bin/setpriv';
const live = new Set();

process.on('exit', () => {
  for (const child of live) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

// The tests' npm dependencies, imported only after checking that `npm ci` ran, so that a missing
// node_modules fails the test with a message that says what to do.
export async function importDependency(name) {
  const dir = path.join(TESTS_DIR, 'node_modules', name);
  if (!existsSync(path.join(dir, 'package.json'))) {
    throw new Error(
      `tests/serve/node_modules/${name} is missing: run make setup (it runs npm ci in tests/serve)`);
  }
  return import(name);
}

// `--chat-template FILE` with the tests' own template (fixtures/chat_template.jinja) when the model folder
// has no chat template of its own (tokenizer_config.json's chat_template, chat_template.jinja), so that
// /v1/chat/completions is on; nothing when it has one.
export const TEST_CHAT_TEMPLATE = path.join(TESTS_DIR, 'fixtures', 'chat_template.jinja');
export function chatTemplateArgs(modelDir = DEFAULT_MODEL_DIR) {
  if (existsSync(path.join(modelDir, 'chat_template.jinja'))) return [];
  try {
    const cfg = JSON.parse(readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
    if (cfg.chat_template) return [];
  } catch {
    // no tokenizer_config.json: no template there
  }
  return ['--chat-template', TEST_CHAT_TEMPLATE];
}

function checkBinary() {
  if (!existsSync(NEXTN_CLI)) {
    throw new Error(`${NEXTN_CLI} does not exist: build nextn (make build) or point NEXTN_CLI at the binary`);
  }
}

export async function startServer({ args = [], timeoutMs = 60_000 * SLOWDOWN, env = {} } = {}) {
  checkBinary();
  const argv = ['serve', '--port', '0', ...args];
  const usePdeathsig = existsSync(SETPRIV);
  const cmd = usePdeathsig ? SETPRIV : NEXTN_CLI;
  const cmdArgs = usePdeathsig ? ['--pdeathsig', 'KILL', '--', NEXTN_CLI, ...argv] : argv;
  const child = spawn(cmd, cmdArgs, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  live.add(child);
  let stderr = '';
  let stdout = '';
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (d) => {
    stdout = (stdout + d).slice(-STDERR_KEEP);
  });
  child.stderr.setEncoding('utf8');
  const ready = new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => {
      reject(new Error(`nextn serve did not print its listening line within ${timeoutMs} ms; ` +
        `command: ${NEXTN_CLI} ${argv.join(' ')}\n--- stderr ---\n${stderr}`));
    }, timeoutMs);
    child.stderr.on('data', (d) => {
      stderr = (stderr + d).slice(-STDERR_KEEP);
      if (seen === null) return;
      seen += d;
      const m = LISTENING.exec(seen);
      if (m) {
        seen = null;
        clearTimeout(timer);
        resolve({ baseURL: m[1].replace(/\/+$/, ''), model: m[2] });
      }
    });
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`could not start ${NEXTN_CLI}: ${e.message}`));
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`nextn serve exited (code ${code}, signal ${signal}) before it was listening; ` +
        `command: ${NEXTN_CLI} ${argv.join(' ')}\n--- stderr ---\n${stderr}`));
    });
  });
  let info;
  try {
    info = await ready;
  } catch (e) {
    child.kill('SIGKILL');
    await exited;
    throw e;
  }
  const server = {
    ...info,
    process: child,
    pid: child.pid,
    argv,
    exited,
    stderr: () => stderr,
    stdout: () => stdout,
    // SIGTERM (the server drains: finishes what it holds, then exits 0), then waits for the exit; past
    // timeoutMs it SIGKILLs. With expectExitCode, a different exit (or a kill) throws, naming stderr.
    async stop({ expectExitCode, timeoutMs: stopTimeout = 30_000 * SLOWDOWN, signal = 'SIGTERM' } = {}) {
      // A server already signalled (a test that sent SIGTERM itself) is only waited for: a second signal
      // would make it exit at once.
      if (child.exitCode === null && child.signalCode === null && !child.killed) child.kill(signal);
      let timer;
      const killed = new Promise((resolve) => {
        timer = setTimeout(() => {
          child.kill('SIGKILL');
          resolve(true);
        }, stopTimeout);
      });
      const res = await Promise.race([exited, killed.then(() => exited.then((r) => ({ ...r, timedOut: true })))]);
      clearTimeout(timer);
      if (expectExitCode !== undefined && (res.timedOut || res.code !== expectExitCode)) {
        throw new Error(`nextn serve ${res.timedOut ? `did not exit within ${stopTimeout} ms of ${signal} ` +
          'and was killed' : `exited with code ${res.code} (signal ${res.signal})`}, expected code ` +
          `${expectExitCode}\n--- stderr ---\n${stderr}`);
      }
      return res;
    },
  };
  return server;
}

// Resident set size of a process in bytes (VmRSS of /proc/PID/status).
export function rssBytes(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
  if (!m) throw new Error(`/proc/${pid}/status has no VmRSS line`);
  return Number(m[1]) * 1024;
}

// Runs the nextn CLI (e.g. `generate ... --json`) and resolves its stdout; rejects naming stderr.
export function runCli(args, { timeoutMs = 120_000 * SLOWDOWN } = {}) {
  checkBinary();
  return new Promise((resolve, reject) => {
    execFile(NEXTN_CLI, args, { timeout: timeoutMs, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${NEXTN_CLI} ${args.join(' ')} failed: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

// Parses Prometheus text format into [{name, labels: {..}, value}].
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/.exec(line);
    if (!m) throw new Error(`not a Prometheus sample line: ${JSON.stringify(line)}`);
    const labels = {};
    if (m[2]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/gy;
      let lm;
      let consumed = 0;
      while ((lm = re.exec(m[2])) !== null) {
        labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
        consumed = re.lastIndex;
      }
      if (consumed !== m[2].length) throw new Error(`bad label set in ${JSON.stringify(line)}`);
    }
    const v = m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : Number(m[3]);
    if (Number.isNaN(v) && m[3] !== 'NaN') throw new Error(`bad value in ${JSON.stringify(line)}`);
    out.push({ name: m[1], labels, value: v });
  }
  return out;
}

// The sum of the samples called `name` whose labels include `where` (e.g. {finished_reason: 'length'}).
export function metricValue(samples, name, where = {}) {
  let sum = 0;
  let found = false;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (!Object.entries(where).every(([k, v]) => s.labels[k] === String(v))) continue;
    sum += s.value;
    found = true;
  }
  return found ? sum : undefined;
}

export async function fetchMetrics(baseURL) {
  const r = await fetch(`${baseURL}/metrics`);
  if (r.status !== 200) throw new Error(`GET /metrics: ${r.status} ${await r.text()}`);
  return parseMetrics(await r.text());
}

// Polls `check` (async, returns truthy when done) every intervalMs until it holds or timeoutMs passes; for
// server state that has no event to wait on (e.g. /metrics gauges reaching 0 after cancellations).
export async function waitFor(check, { timeoutMs = 20_000 * SLOWDOWN, intervalMs = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

// Reads a streamed OpenAI response (fetch Response with an SSE body) strictly: every event must be one
// `data: ` line holding a JSON object, the last `data: [DONE]`. Returns {chunks, done, raw}; throws on any
// deviation. onChunk(chunk) is called as each chunk arrives.
export async function readSSE(response, { onChunk } = {}) {
  const ct = response.headers.get('content-type') ?? '';
  if (!ct.startsWith('text/event-stream')) throw new Error(`stream content-type is ${JSON.stringify(ct)}`);
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const chunks = [];
  let buf = '';
  let done = false;
  let raw = '';
  const handleEvent = (lines) => {
    if (lines.length === 0) return;
    if (done) throw new Error(`event after data: [DONE]: ${JSON.stringify(lines)}`);
    if (lines.length !== 1 || !lines[0].startsWith('data: ')) {
      throw new Error(`event is not a single "data: " line: ${JSON.stringify(lines)}`);
    }
    const data = lines[0].slice(6);
    if (data === '[DONE]') {
      done = true;
      return;
    }
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch (e) {
      throw new Error(`event data is not JSON (${e.message}): ${JSON.stringify(data)}`);
    }
    if (chunk === null || typeof chunk !== 'object' || Array.isArray(chunk)) {
      throw new Error(`event data is not a JSON object: ${data}`);
    }
    chunks.push(chunk);
    onChunk?.(chunk);
  };
  let pending = [];
  for await (const bytes of response.body) {
    const text = decoder.decode(bytes, { stream: true });
    raw += text;
    buf += text;
    let i;
    while ((i = buf.search(/\r\n|\n|\r/)) >= 0) {
      const nl = buf[i] === '\r' && buf[i + 1] === '\n' ? 2 : 1;
      if (buf[i] === '\r' && i + 1 === buf.length) break;  // a CR at the end may be half of CRLF
      const line = buf.slice(0, i);
      buf = buf.slice(i + nl);
      if (line === '') {
        handleEvent(pending);
        pending = [];
      } else if (!line.startsWith(':')) {
        pending.push(line);
      }
    }
  }
  raw += decoder.decode();
  if (buf !== '' || pending.length) throw new Error(`stream ended inside an event: ${JSON.stringify(buf)}`);
  if (!done) throw new Error(`stream ended without data: [DONE] (${chunks.length} chunks)`);
  return { chunks, done, raw };
}
