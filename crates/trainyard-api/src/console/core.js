// @ts-check
// The console's common parts: building DOM (`h`, never from HTML strings, so nothing a user typed is ever
// interpreted as markup), calling the HTTP API with the user's token, and the page's one repeating timer.

export const TOKEN_KEY = "trainyard.token";
const main = document.getElementById("main");
export const TERMINAL = ["Succeeded", "Failed", "Stopped"];
let timer = null;

/// Runs `fn` every `ms` until the page changes (`show`) or `stopRepeating`.
export function repeat(fn, ms) {
  clearInterval(timer);
  timer = setInterval(fn, ms);
}

export function stopRepeating() {
  clearInterval(timer);
  timer = null;
}

/// An element with attributes and children: `on*` attributes are event listeners, `text` its text, `true` an
/// empty attribute, and `undefined`, `null` and `false` (attributes or children) are left out.
/**
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any>} [attrs]
 * @param {...any} children nodes, strings or numbers, or (nested) arrays of them
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function token() {
  return localStorage.getItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.detail || body?.title || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/// Calls the HTTP API with the user's token. `data` is the parsed JSON when the answer is JSON, else its text;
/// a refusal throws an `ApiError` with the problem document as `body`.
/**
 * @param {string} method
 * @param {string} path
 * @param {BodyInit} [body]
 * @param {Record<string, string>} [headers]
 * @returns {Promise<{ data: any, headers: Headers, status: number }>}
 */
export async function api(method, path, body, headers = {}) {
  const r = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${token()}`, ...headers },
    body,
  });
  if (r.status === 401) {
    localStorage.removeItem(TOKEN_KEY);
    location.hash = "#/signin";
    throw new ApiError(401, { detail: "please sign in" });
  }
  const text = await r.text();
  /** @type {any} */
  let data = text;
  if ((r.headers.get("content-type") || "").includes("json")) data = text ? JSON.parse(text) : null;
  if (!r.ok) throw new ApiError(r.status, data);
  return { data, headers: r.headers, status: r.status };
}

export function badge(status) {
  return h("span", { class: `badge ${status.toLowerCase()}`, "data-status": status }, status);
}

export function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

export function show(...nodes) {
  clearInterval(timer);
  timer = null;
  main.replaceChildren(...nodes);
}

export function fail(e) {
  return h("p", { class: "error", role: "alert" }, e.message || String(e));
}

// ---- times ---------------------------------------------------------------------------------------------------

/// A length of time as people say it: "850 ms", "42 s", "3 min 05 s", "2 h 07 min", "3 d 04 h".
export function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  ms = Math.max(0, ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  const hr = Math.floor(m / 60);
  if (hr < 24) return `${hr} h ${String(m % 60).padStart(2, "0")} min`;
  return `${Math.floor(hr / 24)} d ${String(hr % 24).padStart(2, "0")} h`;
}

/// How long ago (or from now) a moment is: "just now", "5 min ago", "2 h ago", "3 d ago"; past a week, the date.
export function ago(ms, now = Date.now()) {
  if (!ms) return "";
  const d = now - ms;
  if (Math.abs(d) < 10_000) return "just now";
  if (d < 0) return `in ${duration(-d).replace(/ \d+ (s|min|h)$/, "")}`;
  if (d < 60_000) return `${Math.floor(d / 1000)} s ago`;
  if (d < 3_600_000) return `${Math.floor(d / 60_000)} min ago`;
  if (d < 86_400_000) return `${Math.floor(d / 3_600_000)} h ago`;
  if (d < 7 * 86_400_000) return `${Math.floor(d / 86_400_000)} d ago`;
  return new Date(ms).toLocaleDateString();
}

/// A moment as a `<time>`: relative in the text, the exact local time on hover and to assistive technology.
export function moment(ms) {
  if (!ms) return h("span", { class: "muted" }, "—");
  const exact = new Date(ms).toLocaleString();
  return h("time", { datetime: new Date(ms).toISOString(), title: exact, "aria-label": `${ago(ms)} (${exact})` }, ago(ms));
}
