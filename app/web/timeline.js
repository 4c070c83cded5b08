// The stage timeline from GET /v1/runs/{id}/timeline (Chrome trace JSON): one lane per
// track (trainer, engine, collector), with episode tracks folded into as few lanes as
// their overlap allows, so a thousand episodes stay readable. Colour = stage.

import { PLOT_CONFIG } from "./charts.js";

const FIXED = ["trainer", "engine", "collector"];
const COLOURS = {
  rollout: "#91a7ff", model_call: "#4c6ef5", env_step: "#20c997", reward: "#fab005",
  queue_wait: "#ced4da", train_step: "#e8590c", weight_sync: "#be4bdb",
  engine_batch: "#1c7ed6", engine_paused: "#f03e3e", checkpoint: "#495057",
};

// -> [{lane, name, start_us, dur_us, step, args, track}]
export function laneSpans(trace) {
  const tracks = new Map();
  for (const e of trace.traceEvents || []) {
    if (e.ph === "M" && e.name === "thread_name") tracks.set(e.tid, e.args && e.args.name);
  }
  const spans = (trace.traceEvents || [])
    .filter((e) => e.ph === "X")
    .map((e) => ({
      name: e.name, start_us: e.ts, dur_us: e.dur || 0, step: e.args ? e.args.step : null,
      args: e.args || {}, track: tracks.get(e.tid) || `track ${e.tid}`,
    }));
  // Fold episodes: greedy interval packing over each episode's whole extent.
  const extent = new Map();
  for (const s of spans) {
    if (!s.track.startsWith("episode/")) continue;
    const x = extent.get(s.track) || { start: Infinity, end: -Infinity };
    x.start = Math.min(x.start, s.start_us);
    x.end = Math.max(x.end, s.start_us + s.dur_us);
    extent.set(s.track, x);
  }
  const laneEnds = [];
  const laneOf = new Map();
  for (const [track, x] of [...extent].sort((a, b) => a[1].start - b[1].start)) {
    let lane = laneEnds.findIndex((end) => end <= x.start);
    if (lane < 0) { lane = laneEnds.length; laneEnds.push(0); }
    laneEnds[lane] = x.end;
    laneOf.set(track, `episodes ${lane + 1}`);
  }
  for (const s of spans) s.lane = laneOf.get(s.track) || s.track;
  return spans;
}

export function drawTimeline(el, trace) {
  const spans = laneSpans(trace);
  const t0 = spans.reduce((m, s) => Math.min(m, s.start_us), Infinity);
  const lanes = [...new Set(spans.map((s) => s.lane))].sort(laneOrder);
  const byStage = new Map();
  for (const s of spans) {
    if (!byStage.has(s.name)) byStage.set(s.name, []);
    byStage.get(s.name).push(s);
  }
  const data = [...byStage].map(([stage, list]) => ({
    type: "bar",
    orientation: "h",
    name: stage,
    y: list.map((s) => s.lane),
    base: list.map((s) => (s.start_us - t0) / 1000),
    x: list.map((s) => Math.max(s.dur_us / 1000, 0.01)),
    marker: { color: COLOURS[stage] || "#868e96" },
    hovertext: list.map((s) => `${stage} · step ${s.step} · ${(s.dur_us / 1000).toFixed(1)} ms · ${s.track}`),
    hoverinfo: "text",
  }));
  const layout = {
    barmode: "overlay",
    margin: { l: 90, r: 12, t: 8, b: 36 },
    xaxis: { title: { text: "ms since the first span shown" }, zeroline: false },
    yaxis: { categoryorder: "array", categoryarray: [...lanes].reverse(), automargin: true },
    legend: { orientation: "h", y: -0.18 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { size: 11 },
    bargap: 0.25,
  };
  if (!spans.length) {
    layout.annotations = [
      { text: "no spans yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 },
    ];
    layout.xaxis.visible = false;
    layout.yaxis.visible = false;
  }
  el.dataset.spans = String(spans.length);
  el.dataset.lanes = String(lanes.length);
  window.Plotly.react(el, data, layout, PLOT_CONFIG);
  return spans.length;
}

function laneOrder(a, b) {
  const rank = (x) => (FIXED.includes(x) ? FIXED.indexOf(x) : x.startsWith("episodes ") ? 100 + Number(x.slice(9)) : 50);
  return rank(a) - rank(b) || a.localeCompare(b);
}

const WINDOW_US = 120e6;
const LIMIT = 5000;

// The newest two minutes of the run (its end, or now while it runs): the timeline
// route pages from the oldest span, and a live run's interesting part is its tail.
// Span times are the workers' wall clocks; if the window finds nothing (a clock far
// off, a run that ended long after its last span), the run's first spans are shown.
export async function loadTimeline(api, path, run, el, noteEl) {
  const endMs = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  const start = Math.max(0, Math.floor(endMs * 1000 - WINDOW_US));
  let trace = await api(`${path}/timeline`, { params: { start_us: start, limit: LIMIT } });
  let note = "the last 2 minutes";
  if (!(trace.traceEvents || []).some((e) => e.ph === "X")) {
    trace = await api(`${path}/timeline`, { params: { limit: LIMIT } });
    note = "from the start";
  }
  const n = drawTimeline(el, trace);
  const cut = trace.otherData && trace.otherData.truncated ? `, the first ${n} spans of it` : "";
  noteEl.textContent = n ? `(${note}${cut}; ${n} spans)` : "";
}
