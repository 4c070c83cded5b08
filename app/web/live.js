// The live metric feed of one run: the SSE stream (resumed with Last-Event-ID after a
// drop), falling back to polling /metrics when the stream cannot be had, and trying the
// stream again now and then. Calls onSteps([{step, metrics}]) and onStatus(status).

import { api, TERMINAL } from "./api.js";
import { readStream } from "./sse.js";

const POLL_MS = 3000;
const POLL_ROUNDS_BEFORE_STREAM_RETRY = 10;

export class LiveMetrics {
  constructor(runId, { onSteps, onStatus, onMode }) {
    this.runId = runId;
    this.onSteps = onSteps;
    this.onStatus = onStatus;
    this.onMode = onMode || (() => {});
    this.lastStep = null; // the newest step received: the stream's Last-Event-ID
    this.status = null;
    this.controller = new AbortController();
    this.stopped = false;
    this.received = 0; // events on the current connection
  }

  stop() {
    this.stopped = true;
    this.controller.abort();
  }

  async run() {
    let failures = 0;
    let streamMissing = false;
    while (!this.stopped) {
      if (!streamMissing) {
        this.received = 0;
        try {
          this.onMode("live");
          await readStream(`/v1/runs/${encodeURIComponent(this.runId)}/metrics/stream`, {
            lastEventId: this.lastStep,
            onEvent: (e) => this.handle(e),
            signal: this.controller.signal,
          });
          failures = 0;
          // The server ends the stream once the run is over and every step was sent.
          if (TERMINAL.has(this.status)) break;
          await this.refreshStatus();
          if (TERMINAL.has(this.status)) { await this.pollOnce(); break; }
          await sleep(1000); // closed early (a restart, a proxy): reconnect from lastStep
          continue;
        } catch (err) {
          if (this.stopped) break;
          if (err.status === 401 || (err.status === 404 && err.code === "not_found")) throw err;
          // no_route: a control plane without the stream; anything else: a drop.
          streamMissing = err.code === "no_route" || err.status === 405;
          // A connection that delivered before it dropped starts the count afresh.
          failures = this.received ? 1 : failures + 1;
        }
      }
      if (failures < 2 && !streamMissing) { await sleep(1000 * failures); continue; }
      this.onMode("polling");
      const done = await this.pollFor(POLL_ROUNDS_BEFORE_STREAM_RETRY);
      if (done) break;
      failures = 0;
    }
    if (!this.stopped) this.onMode("ended");
  }

  handle(event) {
    this.received += 1;
    if (event.event === "metrics") {
      const body = JSON.parse(event.data);
      if (this.lastStep !== null && body.step <= this.lastStep) return; // a resend
      this.lastStep = body.step;
      this.onSteps([{ step: body.step, metrics: body.metrics }]);
    } else if (event.event === "status") {
      this.status = JSON.parse(event.data).status;
      this.onStatus(this.status);
    }
  }

  async refreshStatus() {
    const run = await api(`/v1/runs/${encodeURIComponent(this.runId)}`);
    if (run.status !== this.status) { this.status = run.status; this.onStatus(run.status); }
  }

  // Returns true once the run is over and its last points are in.
  async pollFor(rounds) {
    for (let i = 0; i < rounds && !this.stopped; i++) {
      try {
        await this.refreshStatus();
        const terminal = TERMINAL.has(this.status);
        await this.pollOnce();
        if (terminal) return true;
        this.onMode("polling");
      } catch (err) {
        if (err.status === 401 || err.status === 404) throw err;
        this.onMode("down");
      }
      await sleep(POLL_MS);
    }
    return false;
  }

  async pollOnce() {
    // From the newest step itself, not after it: a step whose points came in two batches
    // is completed here (the store keeps one value per name and step).
    const since = this.lastStep === null ? 0 : this.lastStep;
    const page = await api(`/v1/runs/${encodeURIComponent(this.runId)}/metrics`, {
      params: { since_step: since },
      signal: this.controller.signal,
    });
    const bySteps = new Map();
    for (const p of page.points) {
      if (!bySteps.has(p.step)) bySteps.set(p.step, {});
      bySteps.get(p.step)[p.name] = p.value;
    }
    const steps = [...bySteps.keys()].sort((a, b) => a - b);
    if (!steps.length) return;
    this.lastStep = steps[steps.length - 1];
    this.onSteps(steps.map((step) => ({ step, metrics: bySteps.get(step) })));
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
