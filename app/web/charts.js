// Metric charts. Which metric goes on which chart is decided by its name, so a new
// metric of a known kind (another time/* stage, another *_per_s rate) shows up without
// a change here; everything else is in the "all metrics" table.

// The evaluation's own metrics drawn on the reward chart (the rest are in the table):
// its mean reward and shares, and pass@1 and pass@k (train.eval_k: eval/pass@8, ...).
const HELD_OUT = new Set(["eval/reward_mean", "eval/solved", "eval/used_tool"]);
const isHeldOut = (n) => HELD_OUT.has(n) || /^eval\/pass@\d+$/.test(n);

export const GROUPS = [
  // Training reward beside the held-out evaluation's (every train.eval_interval steps).
  {
    id: "reward",
    kind: "lines",
    match: (n) => (n.startsWith("reward/") && n !== "reward/std") || isHeldOut(n),
  },
  { id: "loss", kind: "lines", match: (n) => /(^|\/|_)loss$/.test(n) || n.startsWith("loss/") },
  { id: "kl", kind: "lines", match: (n) => /(^|[/_])kl($|[/_])/.test(n) },
  // Lines for mean/max (policy versions); the histogram's buckets as bars on the right axis.
  { id: "staleness", kind: "lines", match: (n) => n === "staleness" || n.startsWith("staleness/") },
  {
    id: "throughput",
    kind: "lines",
    match: (n) => n.startsWith("throughput/") || /_per_s$/.test(n),
  },
  { id: "stages", kind: "stack", match: (n) => n.startsWith("time/") },
  // Is the accelerator waiting? trainer/engine busy, blocked and idle fractions of the step.
  { id: "utilisation", kind: "lines", match: (n) => /^(trainer|engine)\/[a-z]+_frac$/.test(n) },
];

// One series per metric name, ordered by step; a step sent twice keeps the newer value.
export class MetricStore {
  constructor() {
    this.series = new Map();
    this.lastStep = null;
  }

  add(steps) {
    for (const { step, metrics } of steps) {
      for (const [name, value] of Object.entries(metrics)) {
        if (!this.series.has(name)) this.series.set(name, { steps: [], values: [] });
        const s = this.series.get(name);
        const last = s.steps.length ? s.steps[s.steps.length - 1] : -Infinity;
        if (step > last) {
          s.steps.push(step);
          s.values.push(value);
        } else {
          const at = s.steps.indexOf(step);
          if (at >= 0) s.values[at] = value;
          else {
            const i = s.steps.findIndex((x) => x > step);
            s.steps.splice(i, 0, step);
            s.values.splice(i, 0, value);
          }
        }
      }
      if (this.lastStep === null || step > this.lastStep) this.lastStep = step;
    }
  }

  names() {
    return [...this.series.keys()].sort();
  }
}

const BASE_LAYOUT = {
  margin: { l: 48, r: 48, t: 28, b: 28 },
  xaxis: { zeroline: false, hoverformat: "d" },
  yaxis: { zeroline: false },
  legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
  hovermode: "x unified",
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { size: 11 },
};
export const PLOT_CONFIG = { displaylogo: false, responsive: true };

// Copies, not the store's arrays: Plotly.react sees a change only in a new array.
function traces(group, store) {
  const names = store.names().filter(group.match);
  return names.map((name) => {
    const s = store.series.get(name);
    const main = name === "reward/mean";
    if (group.kind === "stack") {
      return { type: "bar", name: name.slice("time/".length), x: [...s.steps], y: [...s.values] };
    }
    if (name.startsWith("staleness/bucket_")) {
      return {
        type: "bar", name: `groups at staleness ${name.slice(17)}`, x: [...s.steps],
        y: [...s.values], yaxis: "y2", opacity: 0.35,
      };
    }
    if (isHeldOut(name)) {
      // Few points (one per evaluation), so markers always, dashed to tell them apart.
      return {
        type: "scatter", mode: "lines+markers", name: `held-out ${name.slice(5)}`,
        x: [...s.steps], y: [...s.values], line: { width: 2, dash: "dash" }, marker: { size: 7 },
      };
    }
    return {
      type: "scatter",
      mode: s.steps.length > 60 ? "lines" : "lines+markers",
      name,
      x: [...s.steps],
      y: [...s.values],
      line: { width: main ? 2.5 : 1.5, dash: name.endsWith("/min") || name.endsWith("/max") ? "dot" : "solid" },
      marker: { size: 4 },
      // Rates of different sizes (tokens/s, trajectories/s) share a chart: tokens on the left
      // axis, the rest on the right, so neither is flattened against the other.
      yaxis: group.id === "throughput" && !name.includes("token") ? "y2" : "y",
    };
  });
}

export function drawCharts(store) {
  const Plotly = window.Plotly;
  if (!Plotly) return;
  for (const group of GROUPS) {
    const el = document.getElementById(`chart-${group.id}`);
    if (!el) continue;
    const data = traces(group, store);
    const layout = { ...BASE_LAYOUT, barmode: "stack", showlegend: data.length > 1 };
    if (group.id === "utilisation" && data.length) {
      layout.yaxis = { ...layout.yaxis, range: [0, 1.02], autorange: false };
    }
    if (data.some((t) => t.yaxis === "y2")) {
      layout.yaxis2 = { overlaying: "y", side: "right", zeroline: false, showgrid: false };
    }
    if (!data.length) {
      layout.annotations = [
        { text: "no data yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 },
      ];
      layout.xaxis = { ...layout.xaxis, visible: false };
      layout.yaxis = { visible: false };
    }
    el.dataset.points = String(data.reduce((n, t) => n + t.x.length, 0));
    Plotly.react(el, data, layout, PLOT_CONFIG);
  }
}

export function drawLatest(store, tbody) {
  const rows = store.names().map((name) => {
    const s = store.series.get(name);
    const tr = document.createElement("tr");
    for (const text of [name, fmt(s.values[s.values.length - 1]), `step ${s.steps[s.steps.length - 1]}`]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  tbody.replaceChildren(...rows);
}

export function fmt(v) {
  if (typeof v !== "number" || !Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
  return String(Math.round(v * 10000) / 10000);
}
