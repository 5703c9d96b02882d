// The official OpenAI client (npm "openai") against tailserve's HTTP API: a router + a CPU worker
// serving the default model, started by tests/openai_client_test.sh. Each check prints its result;
// any failure exits non-zero.
//   node openai_client_test.mjs NODE_MODULES_DIR BASE_URL METRICS_URL GOOD_KEY LIMITED_KEY
import { createRequire } from "node:module";
import path from "node:path";
import assert from "node:assert/strict";

const [modules, baseURL, metricsURL, goodKey, limitedKey] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "noop.js"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL, apiKey: goodKey, maxRetries: 0 });
const model = "tiny-en";
let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
async function counter(name) {
  const text = await (await fetch(metricsURL)).text();
  return text.split("\n").filter((l) => l.startsWith(name)).reduce((s, l) => s + Number(l.split(" ").pop()), 0);
}

await check("models list", async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

await check("completion", async () => {
  const r = await client.completions.create({ model, prompt: "The Debian package manager", max_tokens: 12, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.ok(r.choices[0].text.length > 0);
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

const messages = [{ role: "system", content: "You answer briefly." }, { role: "user", content: "What does apt do?" }];
let greedyChat;
await check("chat completion", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices[0].message.role, "assistant");
  greedyChat = r;
});

await check("streamed chat equals the whole response, with usage last", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(chunks > 2);
  assert.equal(text, greedyChat.choices[0].message.content);
  assert.equal(finish, greedyChat.choices[0].finish_reason);
  assert.equal(usage.prompt_tokens, greedyChat.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, greedyChat.usage.completion_tokens);
  // The same prompt again: the worker's prefix cache holds its full blocks, and usage says so.
  assert.equal(usage.prompt_tokens_details.cached_tokens, Math.floor((usage.prompt_tokens - 1) / 16) * 16);
});

await check("stop sequence ends the text before it", async () => {
  const whole = await client.completions.create({ model, prompt: "Debian is", max_tokens: 24, temperature: 0 });
  const text = whole.choices[0].text;
  const words = text.trim().split(/\s+/);
  assert.ok(words.length >= 4, `too short to pick a stop from: ${JSON.stringify(text)}`);
  const stop = " " + words[3];
  const cut = text.slice(0, text.indexOf(stop));
  const r = await client.completions.create({ model, prompt: "Debian is", max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, cut);
  assert.equal(r.choices[0].finish_reason, "stop");
});

await check("seed reproduces a sampled completion", async () => {
  const ask = (seed) => client.completions.create({ model, prompt: "A package", max_tokens: 16, temperature: 0.9, seed });
  const [a, b] = [await ask(7), await ask(7)];
  assert.equal(a.choices[0].text, b.choices[0].text);
});

await check("logprobs: chat and completions, whole and streamed", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const t of content) {
    assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob), `logprob ${t.logprob}`);
    assert.equal(t.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely, and the alternatives come most likely first.
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
    if (!t.token.includes("\uFFFD")) assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3, stream: true,
  });
  const streamed = [];
  for await (const chunk of stream) for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((t) => t.token), content.map((t) => t.token));
  assert.deepEqual(streamed.map((t) => t.logprob), content.map((t) => t.logprob));
  // Completions: the legacy shape, the sampled token's log-probability beside its text.
  const c = await client.completions.create({ model, prompt: "The Debian package manager", max_tokens: 6, temperature: 0, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, c.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.ok(lp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2));
  // Offsets in characters of the text so far (exact where no token splits a character).
  if (!lp.tokens.join("").includes("\uFFFD")) {
    assert.deepEqual(lp.text_offset, lp.tokens.map((_, i) => Array.from(lp.tokens.slice(0, i).join("")).length));
  }
  // Not asked: null.
  const none = await client.completions.create({ model, prompt: "x", max_tokens: 2 });
  assert.equal(none.choices[0].logprobs, null);
});

await check("bad request raises BadRequestError naming the field", async () => {
  await assert.rejects(client.completions.create({ model, prompt: "x", temperature: 9 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, e.constructor.name);
    assert.equal(e.status, 400);
    assert.equal(e.param, "temperature");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model, messages, n: 2 }), (e) => e instanceof OpenAI.BadRequestError && e.param === "n");
});

await check("unknown model raises NotFoundError", async () => {
  await assert.rejects(client.completions.create({ model: "gpt-4o", prompt: "x" }), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

await check("invalid key raises AuthenticationError", async () => {
  const bad = new OpenAI({ baseURL, apiKey: "not-a-key", maxRetries: 0 });
  await assert.rejects(bad.completions.create({ model, prompt: "x", max_tokens: 1 }), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

await check("rate-limited key: 429 with Retry-After, then success after it", async () => {
  const limited = new OpenAI({ baseURL, apiKey: limitedKey, maxRetries: 0 });
  await limited.completions.create({ model, prompt: "x", max_tokens: 1 });
  let retryAfter;
  await assert.rejects(limited.completions.create({ model, prompt: "x", max_tokens: 1 }), (e) => {
    assert.ok(e instanceof OpenAI.RateLimitError, e.constructor.name);
    retryAfter = Number(e.headers.get("retry-after"));
    return true;
  });
  assert.ok(retryAfter >= 1, `Retry-After ${retryAfter}`);
  await new Promise((r) => setTimeout(r, retryAfter * 1000));
  const r = await limited.completions.create({ model, prompt: "x", max_tokens: 1 });
  assert.equal(r.choices.length, 1);
  // The SDK's own retries honour Retry-After.
  const retrying = new OpenAI({ baseURL, apiKey: limitedKey, maxRetries: 2 });
  const again = await retrying.completions.create({ model, prompt: "x", max_tokens: 1 });
  assert.equal(again.choices.length, 1);
});

await check("a client that disconnects cancels its request", async () => {
  const before = await counter('tailserve_router_requests_total{outcome="cancelled"}');
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: "Debian", max_tokens: 400, temperature: 0, stream: true }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const _ of stream) if (++n === 3) controller.abort();
  } catch (e) {
    assert.ok(e.name === "AbortError" || e instanceof OpenAI.APIUserAbortError, e.constructor.name);
  }
  for (let i = 0; i < 50 && (await counter('tailserve_router_requests_total{outcome="cancelled"}')) === before; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(await counter('tailserve_router_requests_total{outcome="cancelled"}'), before + 1);
});

console.log(failures ? `${failures} failed` : "all passed");
process.exit(failures ? 1 : 0);
