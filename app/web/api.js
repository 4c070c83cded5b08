// The API from the browser: the key (kept in localStorage), JSON calls, typed errors.
// Every call carries "Authorization: Bearer <key>"; nothing here builds HTML.

const KEY = "rlaas.apiKey";

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(`HTTP ${status}: ${message}` + (field ? ` (field: ${field})` : ""));
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

// `#key=...` (what `rlaas quickstart` prints) is taken once, stored, and removed from the
// address bar so it is not left in the history or on screen. Other hash params are kept.
export function adoptKeyFromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("key");
  if (!key) return;
  localStorage.setItem(KEY, key);
  params.delete("key");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}

export const getKey = () => localStorage.getItem(KEY);
export const setKey = (key) => localStorage.setItem(KEY, key.trim());
export const forgetKey = () => localStorage.removeItem(KEY);

export function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${getKey() || ""}`, ...extra };
}

export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: a proxy's page, say; the status is all we know
  }
  const err = (body && body.error) || {};
  // A route this server does not have answers FastAPI's {"detail": ...} with no code.
  const code = err.code || (response.status === 404 && body && body.detail ? "no_route" : "http");
  return new ApiError(response.status, code, err.message || response.statusText, err.field || null);
}

export async function api(path, { method = "GET", params, body, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = authHeaders(body === undefined ? {} : { "Content-Type": "application/json" });
  const response = await fetch(url, {
    method,
    headers,
    signal,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await errorOf(response);
  return response.status === 204 ? null : response.json();
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
