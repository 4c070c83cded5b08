// An environment server written from docs/environment-protocol.md alone, as a stranger
// to rlaas would write it: plain node:http and node:crypto, no npm packages.
//
// The game: "what is a + b?", a and b drawn from the episode's seed (so every member of a
// group plays the same sum), one step, reward 1 for an answer that holds the sum.
//
// Usage: node server.js SECRET. It prints its port on stdout, serves until SIGTERM, then
// prints what it saw as one JSON line and exits.
"use strict";
const crypto = require("crypto");
const http = require("http");

const secret = process.argv[2];
if (!secret || secret.length < 16) throw new Error("usage: node server.js SECRET (16+ chars)");

// The page's verify(), as given under "Verifying, in Node".
function verify(secret, rawBody, header, nowSeconds = Date.now() / 1000) {
  if (!header) return false;
  let t = null;
  const macs = [];
  for (const part of header.split(",")) {
    const i = part.indexOf("=");
    if (i < 0) return false;
    const key = part.slice(0, i).trim(), value = part.slice(i + 1);
    if (key === "t") t = value;
    else if (key === "v1") macs.push(value);
  }
  if (t === null || !/^\d+$/.test(t) || macs.length === 0) return false;
  if (Math.abs(nowSeconds - Number(t)) > 300) return false;
  const expected = crypto.createHmac("sha256", secret).update(`${t}.`).update(rawBody).digest("hex");
  return macs.some((mac) => mac.length === expected.length &&
    crypto.timingSafeEqual(Buffer.from(mac), Buffer.from(expected)));
}

const KNOWN_CONFIG = new Set(["max_value"]);
const episodes = new Map(); // episode_id -> {a, b, reset, steps: Map(step -> answer), done}
const seen = { resets: [], steps: [], closes: [], refused: 0, seeds: {}, badSteps: 0 };

function answer(res, status, body) {
  const raw = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": raw.length });
  res.end(raw);
}

function error(res, status, code, message) {
  answer(res, status, { error: { code, message } });
}

function reset(body, res) {
  const { episode_id: id, seed, config } = body;
  if (typeof id !== "string" || !Number.isInteger(seed) || seed < 0 || seed > 2147483647) {
    return error(res, 422, "bad_request", "episode_id must be a string, seed 0..2^31-1");
  }
  const unknown = Object.keys(config || {}).filter((k) => !KNOWN_CONFIG.has(k));
  if (unknown.length) return error(res, 422, "environment_refused", `unknown config key '${unknown[0]}'`);
  seen.resets.push(id);
  seen.seeds[id] = seed;
  let episode = episodes.get(id);
  // A repeated reset of an episode that has taken no step: the first answer again.
  if (!episode || episode.steps.size > 0) {
    const max = (config && config.max_value) || 9;
    episode = { a: seed % (max + 1), b: Math.floor(seed / 7) % (max + 1), steps: new Map(), done: false };
    episode.reset = {
      messages: [
        { role: "system", content: "Answer with the number only." },
        { role: "user", content: `What is ${episode.a} + ${episode.b}?` },
      ],
      info: { a: episode.a, b: episode.b },
    };
    episodes.set(id, episode);
  }
  answer(res, 200, episode.reset);
}

function step(body, res) {
  const { episode_id: id, step: n, action } = body;
  const episode = episodes.get(id);
  if (!episode) return error(res, 404, "unknown_episode", `no episode ${id}`);
  const before = episode.steps.get(n);
  if (before) return answer(res, 200, before); // a retry: the first result again
  if (episode.done || n !== episode.steps.size + 1) {
    seen.badSteps += 1;
    return error(res, 409, "conflict", `step ${n} after done or out of order`);
  }
  seen.steps.push([id, n]);
  const sum = episode.a + episode.b;
  const right = new RegExp(`\\b${sum}\\b`).test(action.content);
  const result = { messages: [], reward: right ? 1.0 : 0.0, done: true, info: { sum } };
  episode.steps.set(n, result);
  episode.done = true;
  answer(res, 200, result);
}

function close(body, res) {
  seen.closes.push(body.episode_id);
  episodes.delete(body.episode_id); // unknown or not: 200, there is nothing to free
  answer(res, 200, { closed: true });
}

const routes = { "/reset": reset, "/step": step, "/close": close };

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const route = routes[req.url];
    if (req.method !== "POST" || !route) return error(res, 404, "not_found", req.url);
    const raw = Buffer.concat(chunks);
    // Verify the raw bytes before parsing them.
    if (!verify(secret, raw, req.headers["x-rlaas-signature"])) {
      seen.refused += 1;
      return error(res, 401, "bad_signature", "X-Rlaas-Signature does not verify");
    }
    let body;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch (e) {
      return error(res, 400, "bad_request", "the body is not JSON");
    }
    route(body, res);
  });
});
server.keepAliveTimeout = 30000;
server.listen({ host: "127.0.0.1", port: 0, backlog: 512 }, () => {
  process.stdout.write(`${server.address().port}\n`);
});
process.on("SIGTERM", () => {
  process.stdout.write(JSON.stringify(seen) + "\n", () => process.exit(0));
});
