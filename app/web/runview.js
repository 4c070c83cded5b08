// One run: header, live charts, what it waits on, timeline, trajectories, all metrics.
// The metric charts are fed by LiveMetrics (SSE, else polling); the rest is polled
// while the run is unfinished and read once more when it ends.

import { api, TERMINAL } from "./api.js";
import { drawCharts, drawLatest, MetricStore } from "./charts.js";
import { drawInflight } from "./inflight.js";
import { LiveMetrics } from "./live.js";
import { badge, totalSteps, when } from "./runs.js";
import { loadTimeline } from "./timeline.js";
import { TrajectoryPanel } from "./trajectories.js";

const REFRESH_MS = 5000;
const DRAW_MS = 150;

const $ = (id) => document.getElementById(id);

export class RunView {
  constructor(runId, { onMode, onError }) {
    this.runId = runId;
    this.path = `/v1/runs/${encodeURIComponent(runId)}`;
    this.onError = onError;
    this.store = new MetricStore();
    this.status = null;
    this.timer = null;
    this.drawPending = false;
    this.missing = new Set(); // panels this control plane has no route for
    this.refreshes = 0;
    this.run = null; // the newest run read
    this.trajectories = new TrajectoryPanel(this.path, {
      api, list: $("trajectories"), more: $("traj-more"), note: $("traj-note"),
      form: $("traj-form"), input: $("traj-step"), onError,
    });
    this.live = new LiveMetrics(runId, {
      onSteps: (steps) => {
        this.store.add(steps);
        this.scheduleDraw();
        // The header's step follows the stream, not just the 5-second refresh.
        if (this.run && this.store.lastStep > this.run.current_step) {
          this.drawHead({ ...this.run, current_step: this.store.lastStep });
        }
      },
      onStatus: (status) => { if (status !== this.status) this.refresh(); },
      onMode,
    });
  }

  async start() {
    $("run-title").textContent = this.runId;
    $("trajectories").replaceChildren();
    $("traj-step").value = "";
    $("run-cancel").onclick = () => this.cancel();
    await this.refresh();
    this.live.run().catch((err) => this.onError(err));
    this.timer = setInterval(() => { if (!TERMINAL.has(this.status)) this.refresh(); }, REFRESH_MS);
  }

  stop() {
    clearInterval(this.timer);
    this.live.stop();
  }

  scheduleDraw() {
    if (this.drawPending) return;
    this.drawPending = true;
    // Many steps arrive at once on connect: draw once for the lot, not once per step.
    // A timer, not requestAnimationFrame: a tab in the background still keeps up.
    setTimeout(() => {
      this.drawPending = false;
      drawCharts(this.store);
      drawLatest(this.store, $("latest").querySelector("tbody"));
    }, DRAW_MS);
  }

  async refresh() {
    try {
      const run = await api(this.path);
      this.drawHead({ ...run, current_step: Math.max(run.current_step, this.store.lastStep ?? 0) });
      const newest = this.store.lastStep === null ? run.current_step : this.store.lastStep;
      await Promise.all([
        this.panel("inflight", async () => {
          drawInflight($("inflight"), $("inflight-age"), await api(`${this.path}/inflight`));
        }),
        // Up to thousands of spans a read: every third refresh is enough for the eye.
        ...(this.refreshes++ % 3 === 0 || TERMINAL.has(run.status)
          ? [
            this.panel("timeline", () => loadTimeline(api, this.path, run, $("timeline"), $("timeline-note"))),
            this.panel("checkpoints", async () => drawCheckpoints(await api(`${this.path}/checkpoints`))),
          ]
          : []),
        this.panel("trajectories", () => this.trajectories.follow(newest)),
      ]);
    } catch (err) {
      this.onError(err);
    }
  }

  // One polled panel; a 404 with no error code means the route is not on this server.
  async panel(name, load) {
    if (this.missing.has(name)) return;
    try {
      await load();
    } catch (err) {
      if (err.code !== "no_route") throw err;
      this.missing.add(name);
      const el = {
        inflight: $("inflight"), timeline: $("timeline"), trajectories: $("trajectories"),
        checkpoints: $("run-checkpoints"),
      }[name];
      el.textContent = `this control plane does not serve ${name} yet`;
    }
  }

  drawHead(run) {
    this.run = run;
    this.status = run.status;
    badge($("run-status"), run.status);
    $("run-title").textContent = run.name ? `${run.name} · ${run.id}` : run.id;
    const total = totalSteps(run);
    const step = total ? `step ${run.current_step} of ${total}` : `step ${run.current_step}`;
    const env = run.spec && run.spec.environment ? run.spec.environment.name : "?";
    $("run-facts").textContent = `${step} · environment ${env} · attempt ${run.attempts} · created ${when(run.created_at)}` +
      (run.finished_at ? ` · finished ${when(run.finished_at)}` : "");
    $("run-error").hidden = !run.error;
    $("run-error").textContent = run.error || "";
    $("run-cancel").hidden = TERMINAL.has(run.status) || run.cancel_requested;
  }

  async cancel() {
    if (!confirm(`Cancel run ${this.runId}? It stops at its next step boundary.`)) return;
    try {
      this.drawHead(await api(`${this.path}/cancel`, { method: "POST" }));
    } catch (err) {
      this.onError(err);
    }
  }
}

// Where a resumed attempt would start: the newest checkpoint the worker recorded.
function drawCheckpoints(page) {
  const items = page.items || [];
  const newest = items[items.length - 1];
  $("run-checkpoints").textContent = newest
    ? `${items.length} checkpoint${items.length === 1 ? "" : "s"}; newest at step ${newest.step}: ${newest.uri}`
    : "no checkpoint yet";
}
