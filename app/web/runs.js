// The run list: every run of this key's tenant, newest first, refreshed every few seconds.

import { api } from "./api.js";

export function badge(el, status) {
  el.className = `badge ${status}`;
  el.textContent = status;
}

export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

export function totalSteps(run) {
  return (run.spec && run.spec.train && run.spec.train.steps) || null;
}

export async function drawRuns(tbody, emptyEl) {
  const page = await api("/v1/runs", { params: { limit: 100 } });
  const rows = page.items.map((run) => {
    const tr = document.createElement("tr");
    tr.className = "run-row";
    tr.dataset.runId = run.id;
    const link = document.createElement("a");
    link.href = `#run=${encodeURIComponent(run.id)}`;
    link.textContent = run.id;
    link.className = "mono";
    const status = document.createElement("span");
    badge(status, run.status);
    const total = totalSteps(run);
    const cells = [link, run.name || "", status, total ? `${run.current_step} / ${total}` : String(run.current_step),
      when(run.created_at), when(run.updated_at)];
    for (const c of cells) {
      const td = document.createElement("td");
      td.append(c);
      tr.append(td);
    }
    tr.addEventListener("click", (e) => {
      if (e.target !== link) location.hash = link.getAttribute("href");
    });
    return tr;
  });
  tbody.replaceChildren(...rows);
  emptyEl.hidden = rows.length > 0;
  return page.items;
}
