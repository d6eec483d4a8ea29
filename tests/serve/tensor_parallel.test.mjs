// `nextn serve --tensor-parallel 2` on the bundled model (docs/parallel.md): the official openai client gets the
// same greedy text as one rank's `nextn generate --json`, streamed too; and a server whose rank 1 vanishes (the
// test seam NEXTN_TEST_TP_EXIT_RANK: as a crash or a kill would) answers requests with an error naming it and
// reports itself failed on /health, instead of hanging.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, importDependency, DEFAULT_MODEL_DIR, SLOWDOWN } from './lib/server.mjs';
import { collectStream, cliGenerate } from './lib/openai_helpers.mjs';

const { default: OpenAI } = await importDependency('openai');
const MODEL_DIR = process.env.NEXTN_MODEL ?? DEFAULT_MODEL_DIR;
const PROMPT = 'def fibonacci(n):';
const servers = [];

after(async () => {
  for (const s of servers) await s.stop();
});

function clientOf(server) {
  return new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOWDOWN });
}

test('two ranks: greedy text equals one rank, plain and streamed', async () => {
  const server = await startServer({ args: ['--model', MODEL_DIR, '--tensor-parallel', '2'] });
  servers.push(server);
  const client = clientOf(server);
  const ref = await cliGenerate(['--model', MODEL_DIR, '--prompt', PROMPT, '-n', '32', '--ignore-eos']);
  const r = await client.completions.create({
    model: server.model, prompt: PROMPT, max_tokens: 32, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.choices[0].text, ref.text);
  const stream = await client.completions.create({
    model: server.model, prompt: PROMPT, max_tokens: 32, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  const { choices } = await collectStream(stream, { chat: false });
  assert.equal(choices[0].text, ref.text);
  const health = await fetch(`${server.baseURL}/health`);
  assert.equal(health.status, 200);
});

test('a rank that vanishes: requests fail naming it, /health says failed, no hang', async () => {
  const server = await startServer({
    args: ['--model', MODEL_DIR, '--tensor-parallel', '2'], env: { NEXTN_TEST_TP_EXIT_RANK: '1' },
  });
  servers.push(server);
  const r = await fetch(`${server.baseURL}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: server.model, prompt: PROMPT, max_tokens: 8 }),
  });
  const body = await r.json();
  assert.equal(r.status, 500, JSON.stringify(body));
  assert.match(body.error.message, /tensor parallel rank 1 exited with status 3/);
  const health = await fetch(`${server.baseURL}/health`);
  assert.equal(health.status, 503);
  const hj = await health.json();
  assert.equal(hj.status, 'failed');
  assert.match(hj.error, /tensor parallel rank 1/);
});
