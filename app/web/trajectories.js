// Sampled trajectories: the episode's text, with the segments the loss trains on
// (segments[].trained, the model's own tokens) highlighted. Model output is untrusted
// text: it only ever goes into textContent, never into HTML.

import { fmt } from "./charts.js";

export function trajectoryElement(t) {
  const box = document.createElement("article");
  box.className = "traj";
  box.dataset.episode = t.episode_id;
  const facts = document.createElement("div");
  facts.className = "facts";
  const pairs = [
    ["episode", t.episode_id], ["step", t.step], ["policy", `v${t.policy_version}`],
    ["reward", fmt(t.reward)], ["end", t.end_reason ? `${t.end_state} (${t.end_reason})` : t.end_state],
    ["turns", t.turns], ["tokens", `${t.model_tokens} model / ${t.total_tokens} total`],
    ["time", `${fmt(t.duration_s)} s`],
  ];
  for (const [label, value] of pairs) {
    const b = document.createElement("b");
    b.textContent = String(value);
    facts.append(`${label} `, b, "  ");
  }
  const text = document.createElement("pre");
  text.className = "text";
  for (const seg of t.segments || []) {
    const span = document.createElement("span");
    span.className = seg.trained ? "seg trained" : "seg";
    span.textContent = seg.text;
    text.append(span);
  }
  box.append(facts, text);
  return box;
}

// The trajectories panel. GET .../trajectories pages oldest first, so "the newest" is
// asked for by step: the newest step with metrics, then a few before it (a step's
// samples may land a moment after its metrics), then the run's first page.
export class TrajectoryPanel {
  constructor(path, { api, list, more, note, form, input, onError }) {
    Object.assign(this, { path, api, list, more, note, onError });
    this.cursor = null;
    this.step = null; // the step shown; null: none yet
    this.pinned = false; // the reader chose a step or paged: stop following the newest
    more.onclick = () => this.older();
    form.onsubmit = (e) => {
      e.preventDefault();
      const value = input.value.trim();
      this.pinned = value !== "";
      this.load(value === "" ? null : Number(value)).catch(onError);
    };
  }

  // newestStep: the newest step the page knows of (metrics), or null.
  async follow(newestStep) {
    if (this.pinned) return;
    await this.load(null, newestStep);
  }

  async load(step, newestStep = null) {
    let page = null;
    let shown = step;
    if (step !== null) {
      page = await this.page({ step });
    } else {
      for (const s of newestStep === null ? [] : [newestStep, newestStep - 1, newestStep - 2]) {
        if (s < 0) break;
        page = await this.page({ step: s });
        if (page.items.length) { shown = s; break; }
      }
      if (!page || !page.items.length) page = await this.page({});
    }
    this.step = shown;
    this.note.textContent = shown === null ? "(earliest)" : `(step ${shown})`;
    this.draw(page, true);
  }

  page(params) {
    return this.api(`${this.path}/trajectories`, { params: { limit: 5, ...params } });
  }

  draw(page, replace) {
    const items = page.items.map(trajectoryElement);
    if (replace) this.list.replaceChildren(...items);
    else this.list.append(...items);
    if (!this.list.children.length) this.list.textContent = "no trajectories sampled yet";
    this.cursor = page.next_cursor;
    this.more.hidden = !page.next_cursor;
  }

  async older() {
    this.pinned = true; // keep what the reader scrolled to
    try {
      const params = { cursor: this.cursor, ...(this.step === null ? {} : { step: this.step }) };
      this.draw(await this.page(params), false);
    } catch (err) {
      this.onError(err);
    }
  }
}
