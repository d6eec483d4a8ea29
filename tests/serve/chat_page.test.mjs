// The chat page (GET /, src/serve/web/index.html) in headless Chromium against a live `nextn serve`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, importDependency, fetchMetrics, metricValue, waitFor, chatTemplateArgs, SLOWDOWN,
} from './lib/server.mjs';
import { pngStats } from './lib/png.mjs';

const { chromium } = await importDependency('playwright-core');

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const SHOT_DIR = process.env.NEXTN_SCREENSHOT_DIR ?? os.tmpdir();
const T = 60_000 * SLOWDOWN;

let server;
let browser;

before(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: run make setup (it installs Debian's chromium)`);
  server = await startServer({ args: chatTemplateArgs() });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--headless=new'] });
});

after(async () => {
  await browser?.close();
  await server?.stop({ expectExitCode: 0 });
});

// A page on the server's `/`, failing on page errors and on any request that leaves the server.
// Chat requests pass through `route`, which records the body the page sent and may add test-only fields
// (ignore_eos keeps the tiny model from ending a reply early; the page itself never sends it).
async function openPage({ extraBody = {} } = {}) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  const problems = [];
  const sent = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // Chromium logs every 4xx answer as "Failed to load resource"; the error test expects one.
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  page.on('request', (r) => {
    if (!r.url().startsWith(`${server.baseURL}/`)) problems.push(`request outside the server: ${r.url()}`);
  });
  await page.route('**/v1/chat/completions', async (route) => {
    const body = JSON.parse(route.request().postData());
    sent.push(body);
    await route.continue({ postData: JSON.stringify({ ...body, ...extraBody }) });
  });
  const res = await page.goto(`${server.baseURL}/`);
  assert.equal(res.status(), 200);
  assert.match(res.headers()['content-type'] ?? '', /^text\/html/);
  await page.waitForFunction((m) => document.querySelector('#model')?.textContent === m, server.model, { timeout: T });
  // Records every length the last assistant reply's text takes, as the DOM changes.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const all = document.querySelectorAll('.msg.assistant');
      const last = all[all.length - 1];
      if (!last) return;
      const n = last.querySelector('.content').textContent.length;
      if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
    }).observe(document.querySelector('#messages'), { childList: true, subtree: true, characterData: true });
  });
  return { page, context, problems, sent };
}

const lastAssistant = (page) => page.locator('.msg.assistant').last();

test('a message streams in token by token, then its stats show', async () => {
  const { page, context, problems, sent } = await openPage({ extraBody: { ignore_eos: true } });
  try {
    const html = readFileSync(new URL('../../src/serve/web/index.html', import.meta.url));
    assert.equal(Buffer.byteLength(await (await fetch(`${server.baseURL}/`)).text()), html.length,
      'GET / serves src/serve/web/index.html');
    await page.fill('#temperature', '0');
    await page.fill('#max-tokens', '160');
    await page.fill('#spec-tokens', '2');
    const prompt = 'Write a Python function that returns the n-th Fibonacci number.';
    await page.fill('#prompt', prompt);
    const m0 = await fetchMetrics(server.baseURL);
    await page.click('#send');
    await page.waitForSelector('.msg.user >> text=Fibonacci', { timeout: T });
    await page.waitForSelector('.msg.assistant[data-state="done"]', { timeout: T });
    assert.equal(await page.locator('#send').isDisabled(), false, 'Send is enabled again');
    assert.equal(await page.locator('#stop').isDisabled(), true, 'Stop is disabled when idle');
    const text = await lastAssistant(page).locator('.content').textContent();
    const lengths = await page.evaluate(() => window.__lengths);
    const growing = lengths.filter((n) => n > 0 && n < text.length);
    assert.ok(growing.length >= 2, `the reply grew over at least 2 observed updates before it was complete: ${lengths}`);
    for (let i = 1; i < lengths.length; i++) assert.ok(lengths[i] > lengths[i - 1], `the reply only grows: ${lengths}`);
    assert.equal(lengths[lengths.length - 1], text.length);
    console.log(`# the reply grew over ${lengths.length} observed updates to ${text.length} characters`);

    // What the page sent.
    assert.equal(sent.length, 1);
    const body = sent[0];
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.deepEqual(body.messages, [{ role: 'user', content: prompt }]);
    assert.equal(body.model, server.model);
    assert.equal(body.temperature, 0);
    assert.equal(body.max_tokens, 160);
    assert.equal(body.num_speculative_tokens, 2);

    // The stats line.
    const stats = lastAssistant(page).locator('.stats');
    const statsText = await stats.textContent();
    assert.match(statsText, /tokens\/s/);
    assert.match(statsText, /mean acceptance length/);
    assert.match(statsText, /draft acceptance/);
    const ds = await stats.evaluate((e) => ({ ...e.dataset }));
    const m1 = await fetchMetrics(server.baseURL);
    assert.equal(Number(ds.tokens), 160, `stats tokens: ${statsText}`);
    assert.equal(Number(ds.tokens),
      metricValue(m1, 'vllm:generation_tokens_total') - metricValue(m0, 'vllm:generation_tokens_total'),
      'the page counts what the server generated');
    assert.equal(ds.tpsSource, 'server', 'tokens/s from the server\'s nextn.decode_tokens_per_second');
    assert.ok(Number(ds.tps) > 0, `tokens/s ${ds.tps}`);
    assert.ok(Number(ds.meanAcceptanceLength) >= 1 && Number(ds.meanAcceptanceLength) <= 3, `MAL ${ds.meanAcceptanceLength}`);
    assert.ok(Number(ds.draftAcceptance) >= 0 && Number(ds.draftAcceptance) <= 1, `acceptance ${ds.draftAcceptance}`);
    assert.equal(ds.finishReason, 'length');

    // The same request through the API, unstreamed: the page assembled the stream into the same text.
    const r = await fetch(`${server.baseURL}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...body, stream: false, stream_options: undefined, ignore_eos: true }),
    });
    const j = await r.json();
    assert.equal(r.status, 200, JSON.stringify(j));
    assert.equal(text, j.choices[0].message.content);

    mkdirSync(SHOT_DIR, { recursive: true });
    const shot = path.join(SHOT_DIR, 'nextn-chat-page.png');
    const png = await page.screenshot({ path: shot });
    const st = pngStats(png);
    assert.equal(st.width, 1100);
    assert.equal(st.height, 760);
    assert.ok(png.length > 10_000, `screenshot is ${png.length} bytes`);
    assert.ok(st.colors >= 16, `screenshot has ${st.colors} colours`);
    assert.ok(st.foreground > 0.01, `screenshot is mostly one colour (${(st.foreground * 100).toFixed(2)}% other)`);
    console.log(`# screenshot: ${shot} (${png.length} bytes, ${st.colors} colours)`);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('Stop aborts a long reply; Enter sends, Shift+Enter is a new line; history goes with the next turn', async () => {
  const { page, context, problems, sent } = await openPage({ extraBody: { ignore_eos: true } });
  try {
    await page.fill('#temperature', '0.7');
    await page.fill('#max-tokens', '3000');
    await page.fill('#spec-tokens', '');
    await page.click('#prompt');
    await page.keyboard.type('class LinkedList:');
    const m0 = await fetchMetrics(server.baseURL);
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const all = document.querySelectorAll('.msg.assistant');
      const last = all[all.length - 1];
      return last && last.dataset.state === 'streaming' && last.querySelector('.content').textContent.length > 20;
    }, null, { timeout: T });
    assert.equal(await page.inputValue('#prompt'), '', 'Enter sent the message and cleared the box');
    assert.equal(await page.locator('#send').isDisabled(), true, 'Send is disabled while a reply streams');
    await page.click('#stop');
    await page.waitForSelector('.msg.assistant[data-state="stopped"]', { timeout: T });
    const stoppedText = await lastAssistant(page).locator('.content').textContent();
    assert.match(await lastAssistant(page).locator('.stats').textContent(), /stopped/);
    // The server cancels the sequence: nothing runs, and far fewer than 3000 tokens were generated.
    await waitFor(async () => metricValue(await fetchMetrics(server.baseURL), 'vllm:num_requests_running') === 0,
      { what: 'num_requests_running 0 after Stop' });
    const m1 = await fetchMetrics(server.baseURL);
    const generated = metricValue(m1, 'vllm:generation_tokens_total') - metricValue(m0, 'vllm:generation_tokens_total');
    assert.ok(generated < 3000, `the server stopped generating (${generated} tokens)`);
    assert.equal(await lastAssistant(page).locator('.content').textContent(), stoppedText, 'no text after Stop');
    assert.equal(await page.locator('#send').isDisabled(), false);

    // Shift+Enter: a new line, nothing sent.
    await page.fill('#max-tokens', '6');
    await page.click('#prompt');
    await page.keyboard.type('first line');
    await page.keyboard.press('Shift+Enter');
    await page.keyboard.type('second line');
    assert.equal(await page.inputValue('#prompt'), 'first line\nsecond line');
    assert.equal(sent.length, 1, 'Shift+Enter sent nothing');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('.msg.assistant[data-state="done"]').length === 1,
      null, { timeout: T });
    assert.equal(sent.length, 2);
    assert.deepEqual(sent[1].messages, [
      { role: 'user', content: 'class LinkedList:' },
      { role: 'assistant', content: stoppedText },
      { role: 'user', content: 'first line\nsecond line' },
    ]);
    assert.equal(sent[1].num_speculative_tokens, undefined, 'blank speculative tokens: the server default');
    assert.equal(await page.locator('.msg.user').count(), 2);
    assert.equal(await page.locator('.msg.assistant').count(), 2);
    assert.equal(await lastAssistant(page).locator('.stats').getAttribute('data-tokens'), '6');
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test('a server error is shown in the conversation', async () => {
  const { page, context, problems } = await openPage();
  try {
    await page.fill('#max-tokens', '100000');
    await page.fill('#prompt', 'hello');
    await page.click('#send');
    const err = page.locator('.msg.error');
    await err.waitFor({ timeout: T });
    const text = await err.textContent();
    assert.match(text, /400/, text);
    assert.match(text, /invalid_request_error/, text);
    assert.match(text, /4096/, `the error names the context limit: ${text}`);
    assert.equal(await page.locator('.msg.assistant').count(), 0, 'no empty reply is left behind');
    assert.equal(await page.locator('.msg.user.failed').count(), 1);
    assert.equal(await page.locator('#send').isDisabled(), false);
    await page.click('#new-chat');
    assert.equal(await page.locator('.msg').count(), 0, 'New chat clears the conversation');
    assert.equal(await page.locator('#empty').isVisible(), true);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});
