// @ts-check
// Two or more tasks' metrics on the same charts: one chart per metric, a line per task and replica, on a time
// axis that counts from each task's start, so runs started hours apart overlay. The tasks are named in the
// address (#/compare?tasks=a,b), so a comparison is a link to share.
//
// Lines: one per task and replica (and label set), never the replicas aggregated into one. Whether a metric's
// replicas should be summed (tokens, memory) or averaged (a loss) is not in its name, and a straggling replica
// is what a comparison should show. To keep that readable, a task has one colour on every chart and its
// replicas are told apart by dash; the legend names each task once, with its replicas after it.

import { api, badge, fail, h, moment, repeat, show, stopRepeating, TERMINAL } from "./core.js";
import { COLOURS, lineChart, MAX_LINES, metricOrder, seriesName, title } from "./charts.js";

/// The most tasks compared at once: one colour each, so no two tasks look alike.
export const MAX_TASKS = COLOURS.length;

/// The address of the comparison of these tasks (names, or ids).
export function compareHash(names) {
  return `#/compare?tasks=${names.map(encodeURIComponent).join(",")}`;
}

/// The task called `name` (or with that id), or null when the caller sees none: a name is found through the
/// list (which leaves deleted tasks out), an id is read directly. A task not shared with the caller and one that
/// does not exist answer alike (the API does not say which), so the page cannot either.
async function findTask(name) {
  const { data } = await api("GET", `/api/v1/tasks?q=${encodeURIComponent(name)}&limit=50`);
  const found = data.items.find((/** @type {any} */ t) => t.name === name || t.id === name);
  if (found) return found;
  try {
    return (await api("GET", `/api/v1/tasks/${encodeURIComponent(name)}`)).data;
  } catch (e) {
    if (e.status === 404) return null;
    throw e;
  }
}

// Where a task's time axis starts: when its attempt began running. A task that has not run yet starts at its
// first sample, and so does one whose samples begin before that moment (the replicas report before the server
// has seen them running), so no line starts left of zero.
function startOf(task, series) {
  let start = task.runStartedAtMs ?? Infinity;
  for (const s of series) if (s.points.length) start = Math.min(start, s.points[0][0]);
  return Number.isFinite(start) ? start : 0;
}

// The lines of one metric, a task's at a time in turn (each task's first replica, then each one's second...),
// so that a chart holding at most MAX_LINES still shows every task.
function interleave(byTask) {
  const out = [];
  const longest = Math.max(0, ...byTask.map((ls) => ls.length));
  for (let i = 0; i < longest; i++) for (const ls of byTask) if (ls[i]) out.push(ls[i]);
  return out;
}

// Puts `els` into `box` in this order, moving only what is out of place (a chart moved would lose the
// keyboard's focus and its cursor), and takes out the rest.
function place(box, els) {
  els.forEach((e, i) => { if (box.children[i] !== e) box.insertBefore(e, box.children[i] || null); });
  while (box.children.length > els.length) box.lastElementChild.remove();
}

export async function comparePage(params) {
  const asked = [...new Set((params.get("tasks") || "").split(",").map((s) => s.trim()).filter(Boolean))];
  const names = asked.slice(0, MAX_TASKS);
  const namesInput = h("input", { id: "compare-names", value: names.join(", "), placeholder: "task-a, task-b", spellcheck: "false", autocomplete: "off" });
  const form = h("form", { class: "filters", id: "compare-form", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = compareHash(namesInput.value.split(",").map((s) => s.trim()).filter(Boolean));
  } }, h("label", { for: "compare-names" }, "Tasks (names or IDs, comma-separated)", namesInput), h("button", { type: "submit" }, "Compare"));
  const list = h("ul", { class: "compare-tasks", id: "compare-tasks" });
  const note = h("p", { class: "muted", id: "compare-note" });
  const shared = h("div", { class: "charts", id: "compare-shared" });
  const partial = h("div", { class: "charts", id: "compare-partial" });
  const sharedSection = h("section", {}, h("h2", { id: "compare-shared-title" }, "Metrics every task has"), shared);
  const partialSection = h("section", { hidden: true }, h("h2", {}, "Metrics only some tasks have"), partial);
  show(
    h("h1", {}, "Compare tasks"),
    form,
    h("p", { class: "muted" }, "Time on every chart runs from each task's start (when its attempt began running), not the clock, so runs started at different times overlay. Each task has one colour; its replicas are told apart by dash. Point at a chart, or focus it and use the arrow keys, to read its values."),
    asked.length > MAX_TASKS ? h("p", { class: "warn", id: "compare-too-many" }, `At most ${MAX_TASKS} tasks at once; left out: ${asked.slice(MAX_TASKS).join(", ")}.`) : "",
    list, note, sharedSection, partialSection,
  );

  // Each name once, with what became of it: the task, or why it is not drawn.
  const found = await Promise.all(names.map(async (name) => {
    try {
      return { name, task: await findTask(name), error: null };
    } catch (e) {
      return { name, task: null, error: e };
    }
  }));
  const tasks = found.filter((f) => f.task);
  const colour = new Map(tasks.map((f, i) => [f.name, i]));
  const charts = new Map();

  // The task list above the charts: a task's colour, its page, its status and start; or why it is missing.
  function drawList(problems) {
    list.replaceChildren(...found.map((f) => {
      if (f.error) return h("li", { "data-task": f.name, class: "error", role: "alert" }, h("strong", {}, f.name), `: ${f.error.message}`);
      if (!f.task) return h("li", { "data-task": f.name, class: "error", role: "alert" }, h("strong", {}, f.name), ": no task of that name that you can see. It does not exist, or it was not shared with you; it is left out.");
      const t = f.task;
      return h("li", { "data-task": f.name },
        h("span", { class: "swatch", style: `background:${COLOURS[colour.get(f.name) % COLOURS.length]}`, "aria-hidden": "true" }),
        h("a", { href: `#/tasks/${encodeURIComponent(t.name)}` }, t.name), " ", badge(t.status),
        h("span", { class: "muted" }, ` attempt ${t.attempt}`, t.runStartedAtMs ? [", started ", moment(t.runStartedAtMs)] : ", not started"),
        problems.has(f.name) ? h("span", { class: "error" }, ` Its metrics could not be read: ${problems.get(f.name)}`) : "");
    }));
  }

  async function load() {
    // Each task afresh (its status, when it started), then its metrics, all at once.
    await Promise.all(tasks.map(async (f) => {
      try { f.task = (await api("GET", `/api/v1/tasks/${f.task.id}`)).data; } catch (e) { /* the last one read stays */ }
    }));
    const problems = new Map();
    const metrics = await Promise.all(tasks.map(async (f) => {
      try {
        return (await api("GET", `/api/v1/tasks/${f.task.id}/metrics`)).data.series;
      } catch (e) {
        problems.set(f.name, e.message);
        return [];
      }
    }));
    drawList(problems);

    // Per metric, per task, its lines on the task's own time axis.
    /** @type {Map<string, Map<string, import("./charts.js").Line[]>>} */
    const byMetric = new Map();
    let end = 0;
    tasks.forEach((f, i) => {
      const series = metrics[i];
      const start = startOf(f.task, series);
      for (const s of series) {
        if (!byMetric.has(s.name)) byMetric.set(s.name, new Map());
        const mine = byMetric.get(s.name);
        if (!mine.has(f.name)) mine.set(f.name, []);
        const part = seriesName(s, f.task.name);
        const points = s.points.map(([at, v]) => [at - start, v]);
        if (points.length) end = Math.max(end, points[points.length - 1][0]);
        mine.get(f.name).push({ label: `${f.task.name} · ${part}`, group: f.task.name, part, colour: colour.get(f.name), dash: mine.get(f.name).length, points });
      }
    });
    const metricNames = [...byMetric.keys()].sort(metricOrder);
    const inAll = metricNames.filter((m) => byMetric.get(m).size === tasks.length);
    const inSome = metricNames.filter((m) => byMetric.get(m).size < tasks.length);
    for (const [m, c] of charts) if (!byMetric.has(m)) { c.el.remove(); charts.delete(m); }
    for (const m of metricNames) {
      if (!charts.has(m)) {
        const c = lineChart(m, { elapsed: true });
        c.el.append(h("p", { class: "muted chart-note chart-only" }));
        charts.set(m, c);
      }
      const c = charts.get(m);
      const mine = byMetric.get(m);
      // Every chart over the same span from zero, so a moment since the start is at the same place in each.
      c.update(interleave(tasks.map((f) => mine.get(f.name) || [])), [0, end]);
      const without = tasks.filter((f) => !mine.has(f.name)).map((f) => f.task.name);
      const having = tasks.filter((f) => mine.has(f.name)).map((f) => f.task.name);
      c.el.querySelector(".chart-only").textContent = without.length ? `Only ${having.join(", ")} ${having.length === 1 ? "reports" : "report"} ${title(m)}; ${without.join(", ")} ${without.length === 1 ? "does" : "do"} not.` : "";
    }
    place(shared, inAll.map((m) => charts.get(m).el));
    place(partial, inSome.map((m) => charts.get(m).el));
    partialSection.hidden = !inSome.length;
    sharedSection.hidden = !inAll.length;

    if (tasks.length < 2) note.textContent = "Pick two or more tasks to compare: tick them on the task list and press Compare, or name them above.";
    else if (!metricNames.length) note.textContent = "No metrics from these tasks yet. The preset ones (CPU, memory, GPU) are sampled while replicas run on the local backend; a task's own need spec.advanced.metrics.";
    else note.textContent = `${tasks.length} tasks, ${metricNames.length} ${metricNames.length === 1 ? "metric" : "metrics"}: ${inAll.length} that every task has${inSome.length ? `, ${inSome.length} that only some have` : ""}. Each task's latest attempt; a chart draws at most ${MAX_LINES} lines.`;
    return tasks.some((f) => !TERMINAL.includes(f.task.status));
  }

  // While any of them runs, the charts follow it; once all have ended, they stay as they are (unless the user
  // has gone to another page meanwhile, whose timer is not this page's to stop).
  const at = location.hash;
  const follow = () => load().then((running) => { if (!running && location.hash === at) stopRepeating(); }, (e) => note.replaceChildren(fail(e)));
  try {
    if (await load()) repeat(follow, 5000);
  } catch (e) {
    note.replaceChildren(fail(e));
  }
}
