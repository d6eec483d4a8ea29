// Helpers for the OpenAI-client tests: stream collection with the invariants docs/server.md states for
// every stream, and the CLI oracle (`nextn generate --json`, `nextn detokenize`).
import assert from 'node:assert/strict';
import { runCli } from './server.mjs';

// Collects a streamed response from the official client (an async iterable of chunks) and checks what every
// stream must satisfy: one id and `created` throughout, the right `object`, exactly one finish_reason per
// choice, for chat the first chunk of each choice carrying delta.role "assistant", each choice's last chunk
// carrying that choice's `nextn`, and (include_usage) one final chunk with choices [], usage and nextn.
// Returns {id, choices: [{text, finishReason, nextn, logprobs, chunks}], usage, nextn, chunkCount}.
export async function collectStream(stream, { chat, includeUsage = true, n = 1 } = {}) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return checkChunks(chunks, { chat, includeUsage, n });
}

export function checkChunks(chunks, { chat, includeUsage = true, n = 1 }) {
  assert.ok(chunks.length > 0, 'the stream had no chunks');
  const id = chunks[0].id;
  assert.match(id, chat ? /^chatcmpl-/ : /^cmpl-/, 'stream id prefix');
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const choices = Array.from({ length: n }, () => ({
    text: '', finishReason: null, nextn: undefined, chunks: 0, sawRole: false, logprobs: [], finishedAt: -1,
  }));
  let usage;
  let nextn;
  chunks.forEach((c, i) => {
    assert.equal(c.id, id, `chunk ${i} id`);
    assert.equal(c.object, object, `chunk ${i} object`);
    assert.equal(c.created, chunks[0].created, `chunk ${i} created`);
    assert.equal(typeof c.model, 'string', `chunk ${i} model`);
    assert.ok(Array.isArray(c.choices), `chunk ${i} choices is an array`);
    if (c.choices.length === 0) {
      assert.ok(includeUsage, `chunk ${i} has no choices, but include_usage was not asked for`);
      assert.equal(usage, undefined, 'two usage chunks');
      assert.equal(i, chunks.length - 1, 'the usage chunk is the last chunk');
      usage = c.usage;
      nextn = c.nextn;
      return;
    }
    assert.ok(!c.usage, `chunk ${i} with choices carries usage`);
    for (const ch of c.choices) {
      assert.ok(Number.isInteger(ch.index) && ch.index >= 0 && ch.index < n, `chunk ${i} choice index ${ch.index}`);
      const st = choices[ch.index];
      assert.equal(st.finishReason, null, `choice ${ch.index} has a chunk after its finish_reason chunk`);
      if (chat) {
        assert.equal(typeof ch.delta, 'object', `chunk ${i} delta`);
        if (st.chunks === 0) assert.equal(ch.delta.role, 'assistant', `first chunk of choice ${ch.index} delta.role`);
        if (ch.delta.role !== undefined) {
          assert.equal(st.chunks, 0, `delta.role again in a later chunk of choice ${ch.index}`);
          st.sawRole = true;
        }
        if (ch.delta.content) st.text += ch.delta.content;
        if (ch.logprobs?.content) st.logprobs.push(...ch.logprobs.content);
      } else {
        assert.equal(typeof ch.text, 'string', `chunk ${i} text`);
        st.text += ch.text;
        if (ch.logprobs) {
          const lp = ch.logprobs;
          assert.equal(lp.tokens.length, lp.token_logprobs.length, `chunk ${i} logprobs lengths`);
          for (let k = 0; k < lp.tokens.length; k++) {
            st.logprobs.push({
              token: lp.tokens[k], logprob: lp.token_logprobs[k], top: lp.top_logprobs?.[k],
              offset: lp.text_offset?.[k],
            });
          }
        }
      }
      st.chunks++;
      if (ch.finish_reason !== null && ch.finish_reason !== undefined) {
        assert.ok(['stop', 'length'].includes(ch.finish_reason), `finish_reason ${ch.finish_reason}`);
        st.finishReason = ch.finish_reason;
        st.finishedAt = i;
        // docs/server.md: "Each choice's last chunk has its finish_reason and that choice's nextn object":
        // nextn inside the choice (as nextn serve sends it) or beside choices (one choice a chunk).
        const x = ch.nextn ?? (c.choices.length === 1 ? c.nextn : undefined);
        assert.ok(x && typeof x === 'object', `the last chunk of choice ${ch.index} carries nextn: ${JSON.stringify(c)}`);
        st.nextn = x;
      }
    }
  });
  choices.forEach((st, k) => assert.notEqual(st.finishReason, null, `choice ${k} got no finish_reason`));
  if (includeUsage) {
    assert.ok(usage, 'include_usage: no usage chunk');
    assert.ok(nextn, 'the usage chunk carries nextn');
  }
  return { id, choices, usage, nextn, chunkCount: chunks.length };
}

export function checkUsage(usage) {
  assert.ok(usage, 'usage present');
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
    assert.ok(Number.isInteger(usage[k]) && usage[k] >= 0, `usage.${k} = ${usage[k]}`);
  }
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, 'usage.total_tokens');
  assert.ok(usage.prompt_tokens > 0, 'usage.prompt_tokens > 0');
}

// The `nextn` extension object: every field docs/server.md names, with the invariants of vLLM's definitions.
export function checkNextn(x, { k } = {}) {
  assert.ok(x && typeof x === 'object', 'nextn extension object present');
  for (const f of ['num_drafts', 'num_draft_tokens', 'num_accepted_tokens']) {
    assert.ok(Number.isInteger(x[f]) && x[f] >= 0, `nextn.${f} = ${x[f]}`);
  }
  for (const f of ['mean_acceptance_length', 'decode_tokens_per_second', 'time_to_first_token_s']) {
    assert.equal(typeof x[f], 'number', `nextn.${f} is a number (${JSON.stringify(x)})`);
    assert.ok(Number.isFinite(x[f]) && x[f] >= 0, `nextn.${f} = ${x[f]}`);
  }
  assert.ok(Array.isArray(x.accepted_per_position), 'nextn.accepted_per_position is an array');
  assert.ok(x.num_accepted_tokens <= x.num_draft_tokens, 'accepted <= draft tokens');
  const perPos = x.accepted_per_position;
  assert.equal(perPos.reduce((a, b) => a + b, 0), x.num_accepted_tokens, 'sum(accepted_per_position) = accepted');
  for (let i = 1; i < perPos.length; i++) {
    assert.ok(perPos[i] <= perPos[i - 1], `accepted_per_position non-increasing: ${perPos}`);
  }
  if (perPos.length) assert.ok(perPos[0] <= x.num_drafts, 'accepted at position 0 <= drafts');
  if (x.num_drafts > 0) {
    assert.ok(Math.abs(x.mean_acceptance_length - (1 + x.num_accepted_tokens / x.num_drafts)) < 1e-6,
      `mean_acceptance_length ${x.mean_acceptance_length} = 1 + accepted/drafts`);
  }
  if (k === 0) {
    assert.equal(x.num_drafts, 0, 'num_speculative_tokens 0: no drafts');
    assert.equal(x.num_draft_tokens, 0, 'num_speculative_tokens 0: no draft tokens');
  } else if (k !== undefined) {
    assert.ok(x.num_drafts > 0, `num_speculative_tokens ${k}: some drafts (${JSON.stringify(x)})`);
    assert.ok(x.num_draft_tokens <= k * x.num_drafts, `num_speculative_tokens ${k}: at most ${k} tokens a draft`);
    assert.ok(perPos.length <= k, `accepted_per_position has at most ${k} positions`);
  }
}

export function assertClose(actual, expected, tol, what) {
  assert.equal(typeof actual, 'number', `${what}: ${actual} is a number`);
  assert.ok(Math.abs(actual - expected) <= tol, `${what}: ${actual} vs ${expected} (tolerance ${tol})`);
}

// `nextn generate ... --json` (greedy unless args say otherwise): {ids, text, finish_reason, logprobs, stats}.
export async function cliGenerate(args) {
  const out = await runCli(['generate', ...args, '--json']);
  return JSON.parse(out.trim().split('\n').pop());
}

export async function cliTokenize(text) {
  return JSON.parse((await runCli(['tokenize', '--text', text])).trim());
}

// Token id -> its text as `nextn detokenize` prints it (cached).
const detokCache = new Map();
export async function detokenize(id) {
  if (!detokCache.has(id)) {
    const out = await runCli(['detokenize', '--ids', String(id)]);
    detokCache.set(id, out.endsWith('\n') ? out.slice(0, -1) : out);
  }
  return detokCache.get(id);
}
