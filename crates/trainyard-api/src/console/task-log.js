// @ts-check
// The task page's log pane: its lines, search, filter, wrap and height. The page feeds it lines (followed live or
// read once); the pane keeps at most MAX_LOG_LINES of them.

import { h } from "./core.js";

const LOG_HEIGHT_KEY = "trainyard.logHeight";
const LOG_WRAP_KEY = "trainyard.logWrap";
/// The log pane's height bounds, in CSS pixels (the upper one also at most 90 % of the window).
const LOG_MIN_PX = 120;
const LOG_MAX_PX = 1600;
const LOG_DEFAULT_PX = 360;
/// How far one arrow key press on the pane's handle moves it.
const LOG_STEP_PX = 40;
/// The most log lines the page holds; past it the oldest go (Download has the whole log).
const MAX_LOG_LINES = 20_000;

function clampHeight(px) {
  const most = Math.max(LOG_MIN_PX * 2, Math.min(LOG_MAX_PX, Math.floor(window.innerHeight * 0.9)));
  return Math.round(Math.min(Math.max(px, LOG_MIN_PX), most));
}

/// The log pane: lines kept as text, shown as text nodes (a search's matches as `<mark>` elements built here,
/// never markup from the log), a search with next/previous and a count that keeps up while lines arrive, a
/// filter to matching lines, line wrap, and a height the user drags (or sets with the arrow keys) and keeps.
export function logView() {
  const pre = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "log" });
  const search = h("input", { type: "search", id: "log-search", placeholder: "Search the log", "aria-label": "Search the log", autocomplete: "off", spellcheck: "false" });
  const count = h("span", { id: "log-count", class: "muted", "aria-live": "polite" });
  const prev = h("button", { type: "button", id: "log-prev", class: "secondary", "aria-label": "Previous match", title: "Previous match (Shift+Enter)" }, "↑");
  const next = h("button", { type: "button", id: "log-next", class: "secondary", "aria-label": "Next match", title: "Next match (Enter)" }, "↓");
  const only = h("input", { type: "checkbox", id: "log-only" });
  const wrap = h("input", { type: "checkbox", id: "log-wrap", checked: localStorage.getItem(LOG_WRAP_KEY) !== "false" });
  const trimmed = h("p", { class: "muted", id: "log-trimmed", hidden: true });
  const waiting = h("p", { class: "muted", id: "log-waiting", role: "status", hidden: true });
  const handle = h("div", { class: "log-resize", id: "log-resize", role: "separator", tabindex: "0", "aria-orientation": "horizontal", "aria-controls": "log", "aria-label": "Resize the log pane (arrow keys)", "aria-valuemin": String(LOG_MIN_PX), "aria-valuemax": String(LOG_MAX_PX) });
  let lines = [];
  let query = "";
  let marks = [];
  let current = -1;
  let dropped = 0;

  function setHeight(px, keep) {
    const v = clampHeight(px);
    pre.style.height = `${v}px`;
    handle.setAttribute("aria-valuenow", String(v));
    if (keep) localStorage.setItem(LOG_HEIGHT_KEY, String(v));
  }
  setHeight(Number(localStorage.getItem(LOG_HEIGHT_KEY)) || LOG_DEFAULT_PX, false);
  handle.addEventListener("keydown", (ev) => {
    const by = { ArrowDown: LOG_STEP_PX, ArrowUp: -LOG_STEP_PX, PageDown: LOG_STEP_PX * 4, PageUp: -LOG_STEP_PX * 4 }[ev.key];
    if (by === undefined) return;
    ev.preventDefault();
    setHeight(pre.getBoundingClientRect().height + by, true);
  });
  handle.addEventListener("pointerdown", (ev) => {
    ev.preventDefault();
    const [y0, h0] = [ev.clientY, pre.getBoundingClientRect().height];
    try { handle.setPointerCapture(ev.pointerId); } catch { /* a synthetic event has no pointer to capture */ }
    const move = (e) => setHeight(h0 + e.clientY - y0, false);
    const up = (e) => {
      setHeight(h0 + e.clientY - y0, true);
      handle.removeEventListener("pointermove", move);
      handle.removeEventListener("pointerup", up);
      handle.removeEventListener("pointercancel", up);
    };
    handle.addEventListener("pointermove", move);
    handle.addEventListener("pointerup", up);
    handle.addEventListener("pointercancel", up);
  });

  const applyWrap = () => pre.classList.toggle("nowrap", !wrap.checked);
  applyWrap();
  wrap.addEventListener("change", () => { localStorage.setItem(LOG_WRAP_KEY, String(wrap.checked)); applyWrap(); });

  const atBottom = () => pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;

  function showCount() {
    if (!query) count.textContent = "";
    else if (!marks.length) count.textContent = "No matches";
    else count.textContent = `${current >= 0 ? current + 1 : 0} of ${marks.length} ${marks.length === 1 ? "match" : "matches"}`;
    prev.disabled = next.disabled = marks.length === 0;
  }

  // Appends lines as they are shown: plain text runs in one text node, each match a <mark>.
  function appendLines(more) {
    if (!query) {
      if (more.length) pre.append(`${more.join("\n")}\n`);
      return;
    }
    const q = query.toLowerCase();
    let text = "";
    for (const line of more) {
      const low = line.toLowerCase();
      let at = low.indexOf(q);
      if (at < 0) {
        if (!only.checked) text += `${line}\n`;
        continue;
      }
      let from = 0;
      while (at >= 0) {
        text += line.slice(from, at);
        if (text) { pre.append(text); text = ""; }
        const m = h("mark", {}, line.slice(at, at + q.length));
        marks.push(m);
        pre.append(m);
        from = at + q.length;
        at = low.indexOf(q, from);
      }
      text += `${line.slice(from)}\n`;
    }
    if (text) pre.append(text);
  }

  function render() {
    pre.replaceChildren();
    marks = [];
    current = -1;
    appendLines(lines);
    showCount();
  }

  function go(by) {
    if (!marks.length) return;
    marks[current]?.classList.remove("current");
    current = current < 0 ? (by > 0 ? 0 : marks.length - 1) : (current + by + marks.length) % marks.length;
    const m = marks[current];
    m.classList.add("current");
    // Scrolls the pane only (the pre is the marks' offset parent), not the page around it.
    pre.scrollTop = Math.max(0, m.offsetTop - pre.clientHeight / 2);
    showCount();
  }

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      query = search.value;
      render();
      if (marks.length) go(1);
    }, 150);
  });
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    // A query typed and entered at once is searched now, not after the pause.
    if (search.value !== query) { clearTimeout(typing); query = search.value; render(); }
    go(ev.shiftKey ? -1 : 1);
  });
  prev.addEventListener("click", () => go(-1));
  next.addEventListener("click", () => go(1));
  only.addEventListener("change", () => { render(); if (marks.length) go(1); });

  return {
    pre,
    controls: h("div", { class: "log-search", role: "search", "aria-label": "log" },
      search, prev, next, count,
      h("label", {}, only, " matching lines only"),
      h("label", {}, wrap, " wrap lines")),
    pane: h("div", { class: "log-pane" }, waiting, trimmed, pre, handle),
    /// Says why there is no log yet (null: there is one).
    waiting(text) { waiting.textContent = text || ""; waiting.hidden = !text; },
    clear() { lines = []; dropped = 0; trimmed.hidden = true; render(); },
    /// Adds lines at the end, following them when the reader was at the end already.
    add(more) {
      if (!more.length) return;
      const follow = atBottom();
      lines.push(...more);
      if (lines.length > MAX_LOG_LINES + MAX_LOG_LINES / 10) {
        dropped += lines.length - MAX_LOG_LINES;
        lines = lines.slice(lines.length - MAX_LOG_LINES);
        trimmed.textContent = `The first ${dropped.toLocaleString()} lines are not shown here; Download has the whole log.`;
        trimmed.hidden = false;
        render();
      } else {
        appendLines(more);
        showCount();
      }
      if (follow) pre.scrollTop = pre.scrollHeight;
    },
    note(text) { pre.append(`\n(${text})`); },
  };
}
