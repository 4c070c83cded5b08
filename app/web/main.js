// Boot and routing. The address says what is shown: "#run=<id>" one run, else the list.
// "#key=<api key>" (as `rlaas quickstart` prints it) is stored once and dropped from it.

import { adoptKeyFromHash, forgetKey, getKey, setKey } from "./api.js";
import { drawRuns } from "./runs.js";
import { RunView } from "./runview.js";

const LIST_REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);
let current = null; // the RunView or the list timer on screen

function setMode(mode) {
  const el = $("conn");
  el.className = `conn ${mode}`;
  el.textContent = { live: "live (stream)", polling: "live (polling)", down: "reconnecting", ended: "run ended" }[mode] || "";
}

function showError(err) {
  if (err && err.status === 401) {
    forgetKey();
    askForKey("That key was not accepted: " + err.message);
    return;
  }
  const el = $("page-error");
  el.textContent = String(err && err.message ? err.message : err);
  el.hidden = false;
}

function askForKey(message) {
  stopCurrent();
  for (const id of ["runs-view", "run-view"]) $(id).hidden = true;
  $("key-panel").hidden = false;
  $("forget-key").hidden = true;
  $("key-error").hidden = !message;
  $("key-error").textContent = message || "";
  $("key-input").focus();
}

function stopCurrent() {
  if (current && current.stop) current.stop();
  if (current && current.timer) clearInterval(current.timer);
  current = null;
  setMode("");
}

async function route() {
  adoptKeyFromHash();
  if (!getKey()) return askForKey();
  stopCurrent();
  $("page-error").hidden = true;
  $("key-panel").hidden = true;
  $("forget-key").hidden = false;
  const runId = new URLSearchParams(location.hash.slice(1)).get("run");
  $("runs-view").hidden = Boolean(runId);
  $("run-view").hidden = !runId;
  if (runId) {
    current = new RunView(runId, { onMode: setMode, onError: showError });
    await current.start();
    return;
  }
  const draw = () => drawRuns($("runs-table").querySelector("tbody"), $("runs-empty")).catch(showError);
  current = { timer: setInterval(draw, LIST_REFRESH_MS) };
  await draw();
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setKey($("key-input").value);
  $("key-input").value = "";
  route();
});
$("forget-key").addEventListener("click", () => { forgetKey(); askForKey(); });
window.addEventListener("hashchange", route);
route();
