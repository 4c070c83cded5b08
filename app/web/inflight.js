// "What is it waiting on": the worker's newest in-flight snapshot (GET .../inflight),
// sent with its heartbeat. The longest-waiting episodes come first: a hang shows who.

import { fmt } from "./charts.js";

const SHOWN = 20;

export function drawInflight(el, ageEl, body) {
  const snap = body && body.snapshot;
  if (!snap) {
    el.replaceChildren(note("nothing reported yet (the worker sends this with its heartbeat)"));
    ageEl.textContent = "";
    return;
  }
  const age = body.reported_at ? (Date.now() - Date.parse(body.reported_at)) / 1000 : null;
  ageEl.textContent = age === null ? "" : `(reported ${fmt(Math.max(age, 0))} s ago)`;
  const head = document.createElement("p");
  const trainer = document.createElement("span");
  trainer.className = "stage";
  trainer.textContent = snap.trainer;
  head.append(`step ${snap.step} · trainer `, trainer,
    ` for ${fmt(snap.trainer_since_s)} s · queue depth ${snap.queue_depth} · ${snap.episodes.length} episode${snap.episodes.length === 1 ? "" : "s"} in flight`);
  const episodes = [...snap.episodes].sort((a, b) => b.since_s - a.since_s);
  const table = document.createElement("table");
  table.className = "grid compact";
  const header = document.createElement("tr");
  for (const h of ["episode", "stage", "for (s)", "turn"]) {
    const th = document.createElement("th");
    th.textContent = h;
    header.append(th);
  }
  table.append(header);
  for (const e of episodes.slice(0, SHOWN)) {
    const tr = document.createElement("tr");
    for (const [i, v] of [e.episode_id, e.stage, fmt(e.since_s), e.turn].entries()) {
      const td = document.createElement("td");
      td.textContent = String(v);
      if (i === 2 && e.since_s > 30) td.className = "stuck";
      tr.append(td);
    }
    table.append(tr);
  }
  const parts = [head];
  if (episodes.length) parts.push(table);
  if (episodes.length > SHOWN) parts.push(note(`and ${episodes.length - SHOWN} more`));
  el.replaceChildren(...parts);
}

function note(text) {
  const p = document.createElement("p");
  p.className = "muted";
  p.textContent = text;
  return p;
}
