// @ts-check
// Line charts of a task's metrics, drawn as SVG here (no library): a time axis with clock labels (or, comparing
// tasks, the time since each one's start), a value axis with 4 to 6 round ticks in the metric's unit, one line per
// replica (and label set) with a legend, a readout of the values at the moment under the pointer or the keyboard's
// cursor, and a summary for assistive technology.

import { ago, h } from "./core.js";

const SVG = "http://www.w3.org/2000/svg";
// Distinct on white and each at least 4.5:1 against it, so a line reads as well as the text beside it.
export const COLOURS = ["#2456c7", "#b4420c", "#1d7a3a", "#8a2fc9", "#b3261e", "#0b6f85", "#8a5a00", "#b0176b"];
// The dash patterns that tell a group's lines apart when they share its colour (the first is solid).
const DASHES = ["", "7 3", "2 2.5", "9 3 2 3"];
/// The most lines one chart draws; the rest are named in a note (a task may label as many series as it likes).
export const MAX_LINES = 12;
const HEIGHT = 190;
const MARGIN = { top: 10, right: 12, bottom: 26, left: 72 };

function svg(tag, attrs = {}) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// ---- units ---------------------------------------------------------------------------------------------------

// The preset metrics the local backend samples, with what people call them; a task's own keep their name.
const PRESET = {
  trainyard_cpu_cores: "CPU",
  trainyard_memory_rss_bytes: "Memory (resident)",
  trainyard_gpu_utilization_percent: "GPU utilisation",
  trainyard_gpu_memory_used_mib: "GPU memory used",
  trainyard_scrape_up: "Metrics endpoint up",
};

export function title(name) {
  return PRESET[name] || name;
}

// The preset metrics first, in this order; a task's own after them by name.
const PRESET_ORDER = ["trainyard_cpu_cores", "trainyard_memory_rss_bytes", "trainyard_gpu_utilization_percent", "trainyard_gpu_memory_used_mib", "trainyard_scrape_up"];

/// The order charts are shown in (for `sort`): the preset metrics first, then the rest by name.
export function metricOrder(a, b) {
  const rank = (n) => (PRESET_ORDER.includes(n) ? PRESET_ORDER.indexOf(n) : PRESET_ORDER.length);
  return rank(a) - rank(b) || a.localeCompare(b);
}

/// What a series is called on its task's charts: its replica without the task's name, and its label set
/// ("master-0 {phase=train}").
export function seriesName(series, taskName) {
  const replica = taskName && series.replica.startsWith(`${taskName}-`) ? series.replica.slice(taskName.length + 1) : series.replica;
  const labels = Object.entries(series.labels).map(([k, v]) => `${k}=${v}`).join(", ");
  return labels ? `${replica} {${labels}}` : replica;
}

/// A metric's unit from its name's suffix, as Prometheus names them (the CLI's `metrics` reads them the same
/// way): bytes, MiB, percent, cores, seconds, or a plain number.
export function unitOf(name) {
  const ends = (...s) => s.some((x) => name.endsWith(x));
  if (ends("_bytes", "_bytes_total")) return "bytes";
  if (ends("_mib")) return "mib";
  if (ends("_percent", "_ratio_percent")) return "percent";
  if (ends("_cores")) return "cores";
  if (ends("_seconds", "_seconds_total")) return "seconds";
  return "plain";
}

// A number without float noise and without exponent notation: at most `digits` decimals, trailing zeros cut.
function plainNumber(x, digits) {
  const s = x.toFixed(Math.max(0, Math.min(digits, 12)));
  return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
}

// How many decimals show `x` to about four significant figures.
function decimalsFor(x) {
  if (x === 0 || !Number.isFinite(x)) return 0;
  return Math.max(0, 3 - Math.floor(Math.log10(Math.abs(x))));
}

const IEC = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
const SI_UP = ["", "k", "M", "G", "T", "P", "E"];

// The scale a set of values is shown in: a divisor and its suffix, chosen from the largest magnitude so every
// tick of an axis has the same suffix ("0 MiB, 50 MiB, 100 MiB", never "900 KiB, 1 MiB").
function scaleFor(unit, magnitude) {
  const m = Math.abs(magnitude);
  switch (unit) {
    case "bytes":
    case "mib": {
      let i = 0;
      while (i + 1 < IEC.length && m >= 1024 ** (i + 1)) i++;
      return { div: 1024 ** i, suffix: ` ${IEC[i]}` };
    }
    case "percent":
      return { div: 1, suffix: " %" };
    case "cores":
      return { div: 1, suffix: " cores" };
    case "seconds":
      if (m > 0 && m < 1) return { div: 1e-3, suffix: " ms" };
      if (m < 120) return { div: 1, suffix: " s" };
      if (m < 7200) return { div: 60, suffix: " min" };
      if (m < 172800) return { div: 3600, suffix: " h" };
      return { div: 86400, suffix: " d" };
    default: {
      // Small numbers stay decimals (a learning rate of 0.0003 is not "300 µ"); large ones take k, M, G...
      let i = 0;
      while (i + 1 < SI_UP.length && m >= 1000 ** (i + 1)) i++;
      return { div: 1000 ** i, suffix: i ? SI_UP[i] : "" };
    }
  }
}

// MiB metrics are bytes to everything that shows them.
function toBase(unit, v) {
  return unit === "mib" ? v * 1048576 : v;
}

/// One value in its unit, to about four significant figures: "182.4 MiB", "0.53 cores", "248.6M", "12.5 %".
export function formatValue(unit, raw) {
  if (!Number.isFinite(raw)) return String(raw);
  const v = toBase(unit, raw);
  const { div, suffix } = scaleFor(unit, v);
  const x = v / div;
  const text = plainNumber(x, decimalsFor(x));
  return `${text}${unit === "cores" && text === "1" ? " core" : suffix}`;
}

// ---- ticks ---------------------------------------------------------------------------------------------------

// The smallest step of 1, 2, 2.5 or 5 times a power of ten that covers [a, b] in at most 6 ticks: {step, first, n}.
function roundSteps(a, b) {
  let best = null;
  // From a tenth of the smallest useful step upwards: a step as large as the range is reached within 4 powers
  // of ten, so the loop is bounded; a range too large for a float has none (null).
  const e0 = Math.floor(Math.log10((b - a) / 6)) - 1;
  for (let e = e0; Number.isFinite(e0) && e <= e0 + 5 && !best; e++) {
    for (const m of [1, 2, 2.5, 5]) {
      const step = m * 10 ** e;
      const first = Math.floor(a / step + 1e-9) * step;
      const last = Math.ceil(b / step - 1e-9) * step;
      const n = Math.round((last - first) / step) + 1;
      if (n <= 6) { best = { step, first, n }; break; }
    }
  }
  return best;
}


/// 4 to 6 round ticks (1, 2, 2.5 or 5 times a power of ten, in the unit's scale) covering [lo, hi], and the
/// axis's range (the outer ticks). A flat series gets a range around its value; non-negative data starts at 0.
export function valueTicks(unit, lo, hi) {
  lo = toBase(unit, lo);
  hi = toBase(unit, hi);
  if (lo >= 0) lo = 0;
  if (unit === "percent" && hi <= 100 && lo >= 0) hi = Math.max(hi, 100);
  if (hi === lo) hi = lo === 0 ? 1 : lo + Math.abs(lo);
  let { div, suffix } = scaleFor(unit, Math.max(Math.abs(lo), Math.abs(hi)));
  let best = roundSteps(lo / div, hi / div);
  // A plain number's ticks in whole units of the suffix below rather than fractions ("250", not "0.25k").
  if (unit === "plain" && div >= 1000 && best && best.step < 1) {
    div /= 1000;
    suffix = SI_UP[Math.round(Math.log10(div) / 3)];
    best = roundSteps(lo / div, hi / div);
  }
  // In the metric's own unit again, for placing points (MiB series are drawn in MiB).
  const back = unit === "mib" ? 1048576 : 1;
  if (!best) {
    const [l, u] = [lo / back, hi / back];
    return { ticks: [{ value: l, label: formatValue(unit, l) }, { value: u, label: formatValue(unit, u) }], lo: l, hi: u };
  }
  const decimals = Math.max(0, -Math.floor(Math.log10(best.step) + 1e-9) + (best.step % 1 ? 1 : 0));
  const ticks = [];
  for (let i = 0; i < best.n; i++) {
    const x = best.first + i * best.step;
    // A plain number's zero needs no suffix ("0", "200M", "400M"); a unit's does ("0 MiB").
    const bare = x === 0 && unit === "plain";
    ticks.push({ value: x * div, label: bare ? "0" : `${plainNumber(x, decimals)}${suffix}` });
  }
  return { ticks: ticks.map((t) => ({ ...t, value: t.value / back })), lo: ticks[0].value / back, hi: ticks[ticks.length - 1].value / back };
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);

// The smallest round step (a second to a day, then whole days) that puts at most `most` ticks on [t0, t1].
function timeStep(t0, t1, most) {
  const span = Math.max(1, t1 - t0);
  return TIME_STEPS.find((s) => span / s <= most) || Math.ceil(span / most / 86400000) * 86400000;
}

/// Time ticks on round local clock times, at most `most` of them, labelled "14:05" (or "14:05:30" when they
/// are under a minute apart; with the date when the range passes a day).
export function timeTicks(t0, t1, most) {
  const step = timeStep(t0, t1, most);
  const offset = new Date(t0).getTimezoneOffset() * 60000;
  const ticks = [];
  for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1; t += step) {
    const d = new Date(t);
    /** @type {Intl.DateTimeFormatOptions} */
    const opts = step < 60000 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
    const label = step >= 86400000 ? d.toLocaleDateString([], { month: "short", day: "numeric" }) : d.toLocaleTimeString([], { ...opts, hour12: false });
    ticks.push({ t, label });
  }
  return ticks;
}

/// A time since a start as a stopwatch shows it: "0:07", "12:30", "1:05:00" (whole seconds; "-0:02" before it).
export function elapsedText(ms) {
  const s = Math.round(Math.abs(ms) / 1000);
  const [hr, min, sec] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  const two = (n) => String(n).padStart(2, "0");
  return `${ms < 0 && s ? "-" : ""}${hr ? `${hr}:${two(min)}` : min}:${two(sec)}`;
}

/// Ticks on an axis of time since a start (ms), at round steps from it, at most `most` of them: "0:00", "0:30",
/// "1:00".
export function elapsedTicks(t0, t1, most) {
  const step = timeStep(t0, t1, most);
  const ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push({ t, label: elapsedText(t) });
  return ticks;
}

// At most about two points per pixel column: the first, smallest and largest, and last of each column, so a
// spike stays visible however long the series.
function thin(points, x0, x1, columns) {
  if (points.length <= columns * 2) return points;
  const out = [];
  let col = null, bucket = [];
  const flush = () => {
    if (!bucket.length) return;
    let lo = bucket[0], hi = bucket[0];
    for (const p of bucket) { if (p[1] < lo[1]) lo = p; if (p[1] > hi[1]) hi = p; }
    const keep = [bucket[0], lo, hi, bucket[bucket.length - 1]].sort((a, b) => a[0] - b[0]);
    for (const p of keep) if (out[out.length - 1] !== p) out.push(p);
    bucket = [];
  };
  for (const p of points) {
    const c = Math.floor(((p[0] - x0) / (x1 - x0 || 1)) * columns);
    if (c !== col) { flush(); col = c; }
    bucket.push(p);
  }
  flush();
  return out;
}

// ---- the chart -------------------------------------------------------------------------------------------------

// A moment on a clock axis's readout: the local time and how long ago, the exact moment on hover.
function clock(t) {
  const at = new Date(t);
  return h("time", { datetime: at.toISOString(), title: at.toLocaleString() }, `${at.toLocaleTimeString([], { hour12: false })} (${ago(t)})`);
}

/**
 * One line of a chart.
 * @typedef {object} Line
 * @property {string} label what the readout and the summary call it
 * @property {Array<[number, number]>} points `[atMs, value]`, oldest first
 * @property {string} [group] the task it is one of, when a chart compares tasks: the legend names each group once,
 *   with its lines under it
 * @property {string} [part] the line within its group (a replica and label set), as the legend says it
 * @property {number} [colour] its colour (an index; by default its place in the chart), shared by a group's lines
 * @property {number} [dash] its dash pattern (an index; solid by default), which tells a group's lines apart
 */

const colourOf = (/** @type {Line} */ l, i) => COLOURS[(l.colour ?? i) % COLOURS.length];
const dashOf = (/** @type {Line} */ l) => DASHES[(l.dash ?? 0) % DASHES.length];

// A line's mark in the legend and the readout: a square of its colour, or, for a group's line, a short stroke
// with its dash.
function mark(/** @type {Line} */ l, i) {
  if (!l.group) return h("span", { class: "swatch", style: `background:${colourOf(l, i)}`, "aria-hidden": "true" });
  const s = svg("svg", { width: 20, height: 8, class: "stroke-sample", "aria-hidden": "true" });
  s.append(svg("line", { x1: 1, x2: 19, y1: 4, y2: 4, stroke: colourOf(l, i), "stroke-width": 2.5, ...(dashOf(l) ? { "stroke-dasharray": dashOf(l) } : {}) }));
  return s;
}

/// A chart of one metric. `update(lines, span)` redraws it with `lines` (see `Line`) over the time span
/// `[fromMs, toMs]` (the page gives every chart the same, so they line up); it also redraws itself when its
/// width changes, so it always fits its column. With `elapsed`, times are milliseconds since a start (each
/// task's own, when tasks are compared) and the axis counts from it ("0:30", "1:00") instead of telling the clock.
export function lineChart(metric, { elapsed = false } = {}) {
  const unit = unitOf(metric);
  const id = `chart-${metric.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  // Announced when the keyboard moves the cursor, not at every move of a pointer.
  const readout = h("div", { class: "chart-readout", id: `${id}-readout`, "aria-live": "off" });
  const plot = h("div", { class: "chart-plot" });
  const legend = h("ul", { class: "chart-legend", "aria-label": `${title(metric)}: series` });
  const note = h("p", { class: "muted chart-note" });
  const heading = h("h3", { id: `${id}-title` }, title(metric), title(metric) !== metric ? h("span", { class: "muted mono" }, ` ${metric}`) : "");
  const el = h("figure", { class: "chart", "data-metric": metric, "data-unit": unit, "aria-labelledby": `${id}-title` }, heading, plot, readout, legend, note);
  let lines = [];
  let span = null;
  let cursor = null; // the time the readout shows, kept across redraws
  let width = 0;
  let drawn = ""; // what the drawing shows (series, their sample counts and last moments, the width)

  function summary() {
    const parts = lines.map((l) => {
      const ys = l.points.map((p) => p[1]);
      if (!ys.length) return `${l.label}: no samples`;
      return `${l.label}: last ${formatValue(unit, ys[ys.length - 1])}, min ${formatValue(unit, Math.min(...ys))}, max ${formatValue(unit, Math.max(...ys))}`;
    });
    const over = elapsed ? "by time since each start" : "over time";
    return `${title(metric)} ${over}, ${lines.length} series. ${parts.join("; ")}.`;
  }

  function draw() {
    width = plot.clientWidth;
    if (!width) return;
    // A refresh that brought nothing new leaves the drawing (and the reader's place in it) alone.
    const now = `${width}|${span}|${lines.map((l) => `${l.label}:${l.points.length}:${l.points[l.points.length - 1]?.[0]}`).join("|")}`;
    if (now === drawn) return;
    drawn = now;
    const all = lines.flatMap((l) => l.points);
    if (!all.length) {
      plot.replaceChildren(h("p", { class: "muted" }, "No samples yet."));
      return;
    }
    const w = width, ht = HEIGHT;
    const [pl, pr, pt, pb] = [MARGIN.left, w - MARGIN.right, MARGIN.top, ht - MARGIN.bottom];
    let t0 = Infinity, t1 = -Infinity, v0 = Infinity, v1 = -Infinity;
    for (const [t, v] of all) { t0 = Math.min(t0, t); t1 = Math.max(t1, t); v0 = Math.min(v0, v); v1 = Math.max(v1, v); }
    if (span) [t0, t1] = [Math.min(t0, span[0]), Math.max(t1, span[1])];
    if (t1 === t0) { t0 -= 30000; t1 += 30000; }
    const y = valueTicks(unit, v0, v1);
    const sx = (t) => pl + ((t - t0) / (t1 - t0)) * (pr - pl);
    const sy = (v) => pb - ((v - y.lo) / (y.hi - y.lo)) * (pb - pt);
    const root = svg("svg", { width: w, height: ht, viewBox: `0 0 ${w} ${ht}`, role: "img", "aria-label": summary(), tabindex: "0", "aria-describedby": readout.id, class: "chart-svg" });
    const grid = svg("g", { class: "grid" });
    for (const tk of y.ticks) {
      const yy = Math.round(sy(tk.value)) + 0.5;
      grid.append(svg("line", { x1: pl, x2: pr, y1: yy, y2: yy }));
      const label = svg("text", { x: pl - 6, y: yy, "text-anchor": "end", "dominant-baseline": "middle", class: "tick y-tick" });
      label.textContent = tk.label;
      grid.append(label);
    }
    for (const tk of (elapsed ? elapsedTicks : timeTicks)(t0, t1, Math.max(2, Math.floor((pr - pl) / 70)))) {
      const xx = Math.round(sx(tk.t)) + 0.5;
      // A label that would run under the value axis's labels or off the right edge is left out (about 6.5 px a
      // character at this size).
      const half = tk.label.length * 3.3;
      if (xx - half < pl - 8 || xx + half > w - 1) continue;
      grid.append(svg("line", { x1: xx, x2: xx, y1: pb, y2: pb + 4, class: "x-mark" }));
      const label = svg("text", { x: xx, y: pb + 16, "text-anchor": "middle", class: "tick x-tick" });
      label.textContent = tk.label;
      grid.append(label);
    }
    grid.append(svg("line", { x1: pl, x2: pr, y1: pb + 0.5, y2: pb + 0.5, class: "axis" }));
    root.append(grid);
    lines.forEach((l, i) => {
      const pts = thin(l.points, t0, t1, pr - pl);
      // A compared task's lines say whose they are (and the dash that tells its replicas apart).
      const whose = { ...(l.group ? { "data-group": l.group } : {}), ...(dashOf(l) ? { "stroke-dasharray": dashOf(l) } : {}) };
      if (pts.length === 1) {
        root.append(svg("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 2.5, fill: colourOf(l, i), ...(l.group ? { "data-group": l.group } : {}) }));
        return;
      }
      root.append(svg("polyline", { points: pts.map(([t, v]) => `${sx(t).toFixed(1)},${sy(v).toFixed(1)}`).join(" "), fill: "none", stroke: colourOf(l, i), "stroke-width": 1.75, "stroke-linejoin": "round", class: "series", ...whose }));
    });
    const hover = svg("g", { class: "hover" });
    root.append(hover);
    // The moments with a sample, for the pointer and the arrow keys to step through.
    const times = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);

    function showAt(t) {
      hover.replaceChildren();
      if (t === null) { readout.textContent = ""; return; }
      const xx = sx(t);
      hover.append(svg("line", { x1: xx, x2: xx, y1: pt, y2: pb, class: "cursor" }));
      const rows = [];
      lines.forEach((l, i) => {
        // A series' sample nearest to the moment, if one is within a tenth of the range of it.
        let best = null;
        for (const p of l.points) if (!best || Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
        if (!best || Math.abs(best[0] - t) > (t1 - t0) / 10) return;
        hover.append(svg("circle", { cx: sx(best[0]), cy: sy(best[1]), r: 3.5, fill: "#fff", stroke: colourOf(l, i), "stroke-width": 2 }));
        rows.push(h("span", { class: "chart-value" }, mark(l, i), `${l.label} `, h("strong", {}, formatValue(unit, best[1]))));
      });
      readout.replaceChildren(elapsed ? h("span", { class: "chart-at" }, `${elapsedText(t)} since start`) : clock(t), " ", ...rows);
    }
    const nearest = (t) => times.reduce((a, b) => (Math.abs(b - t) < Math.abs(a - t) ? b : a), times[0]);
    root.addEventListener("pointermove", (ev) => {
      readout.setAttribute("aria-live", "off");
      const r = root.getBoundingClientRect();
      const x = Math.min(Math.max(ev.clientX - r.left, pl), pr);
      cursor = nearest(t0 + ((x - pl) / (pr - pl)) * (t1 - t0));
      showAt(cursor);
    });
    root.addEventListener("pointerleave", () => { if (document.activeElement !== root) { cursor = null; showAt(null); } });
    root.addEventListener("focus", () => { if (cursor === null) cursor = times[times.length - 1]; showAt(cursor); });
    root.addEventListener("blur", () => { cursor = null; showAt(null); });
    root.addEventListener("keydown", (ev) => {
      const i = times.indexOf(nearest(cursor ?? times[times.length - 1]));
      const to = { ArrowLeft: i - 1, ArrowRight: i + 1, Home: 0, End: times.length - 1, PageUp: i - 10, PageDown: i + 10 }[ev.key];
      if (to === undefined) return;
      ev.preventDefault();
      readout.setAttribute("aria-live", "polite");
      cursor = times[Math.min(Math.max(to, 0), times.length - 1)];
      showAt(cursor);
    });
    // The old drawing's blur (when it had focus) would forget the cursor: kept across the swap.
    const hadFocus = plot.contains(document.activeElement);
    const keep = cursor;
    plot.replaceChildren(root);
    cursor = keep;
    if (hadFocus) root.focus({ preventScroll: true });
    if (cursor !== null) showAt(nearest(cursor));
  }

  function update(next, over = null) {
    const shown = next.slice(0, MAX_LINES);
    lines = shown;
    span = over;
    legend.replaceChildren(...legendItems(shown));
    note.textContent = next.length > MAX_LINES ? `${next.length - MAX_LINES} more series not drawn (the CLI's trainyard metrics lists them all).` : "";
    draw();
  }

  // A line's legend entry: its mark, its name and its last value.
  function entry(/** @type {Line} */ l, i, name) {
    const last = l.points[l.points.length - 1];
    return [mark(l, i), name, last ? h("span", { class: "muted" }, ` ${formatValue(unit, last[1])}`) : ""];
  }

  // An item per line; comparing tasks, an item per task naming it once, with its lines (replicas) after it.
  function legendItems(/** @type {Line[]} */ shown) {
    if (!shown.some((l) => l.group)) return shown.map((l, i) => h("li", { "data-series": l.label }, ...entry(l, i, l.label)));
    const groups = new Map();
    shown.forEach((l, i) => {
      if (!groups.has(l.group)) groups.set(l.group, []);
      groups.get(l.group).push(h("span", { class: "chart-part", "data-series": l.label }, ...entry(l, i, l.part ?? l.label)));
    });
    return [...groups].map(([group, parts]) => h("li", { "data-group": group }, h("strong", {}, group), " ", ...parts));
  }

  // Redrawn at its own width, so the chart fits a phone as well as a wide screen.
  new ResizeObserver(() => draw()).observe(plot);
  return { el, update };
}
