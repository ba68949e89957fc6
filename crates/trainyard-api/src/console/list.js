// @ts-check
// The task list: tabs (everything the user may see, their own, their project groups'), filters, all kept in
// the URL so that a reload or a shared link shows the same list; pages by cursor, refreshed while nothing
// more is loaded. Tasks ticked in it are compared on one page of charts.

import { compareHash } from "./compare.js";
import { api, badge, duration, fail, h, moment, repeat, show, TERMINAL } from "./core.js";

const FILTERS = ["q", "status", "type", "owner", "group", "labels", "accelerator", "sort"];

const TABS = [
  ["all", "All I can see"],
  ["mine", "Mine"],
  ["groups", "My project groups"],
];

/// The tab to focus once the page is drawn again: a tab chosen with the keyboard keeps the focus.
let focusTab = null;

/// Memory as people read it: whole GiB when exact, else MiB (as the server's own texts say it).
function memory(mib) {
  return mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

/// Replicas alike, as one line and the rest: "2 × 1 GPU" with "8 vCPU, 32 GiB each", or "4 vCPU, 8 GiB".
function shapeText(s) {
  const n = s.replicas > 1 ? `${s.replicas} × ` : "";
  const cpu = `${s.vcpus} vCPU, ${memory(s.memoryMib)}`;
  return s.gpus > 0 ? [`${n}${s.gpus} GPU`, `${cpu}${s.replicas > 1 ? " each" : ""}`] : [`${n}${cpu}`, null];
}

/// The shapes of a placement's replicas, neighbours of one size counted together.
function placedShapes(placement) {
  const shapes = [];
  for (const r of placement?.replicas || []) {
    const { gpus, vcpus, memoryMib } = r.resources;
    const last = shapes[shapes.length - 1];
    if (last && last.gpus === gpus && last.vcpus === vcpus && last.memoryMib === memoryMib) last.replicas += 1;
    else shapes.push({ replicas: 1, gpus, vcpus, memoryMib });
  }
  return shapes;
}

/// What a task takes (placed) or asks for (its first instance-spec option, summed when it was created).
function resources(t) {
  const placed = placedShapes(t.placement);
  const shapes = placed.length ? placed : t.demand?.shapes || [];
  if (!shapes.length) return h("span", { class: "muted" }, "—");
  const lines = shapes.map(shapeText);
  const more = !placed.length && t.demand.options > 1 ? `first of ${t.demand.options} options` : null;
  return [
    h("div", {}, lines.map(([main]) => main).join(" + ")),
    lines.some(([, rest]) => rest) ? h("div", { class: "muted" }, lines.map(([, rest]) => rest).filter(Boolean).join(" + ")) : null,
    more ? h("div", { class: "muted" }, more) : null,
  ];
}

/// How long a task has waited, has run or ran, by its status.
function elapsed(t, now) {
  const since = (ms) => duration(now - ms);
  if (t.status === "Queued") return h("span", {}, `queued ${since(t.statusSinceMs)}`);
  if (["Admitted", "Starting", "Prechecking"].includes(t.status)) return h("span", {}, `starting ${since(t.statusSinceMs)}`);
  if (t.status === "Running") return h("span", {}, `running ${since(t.runStartedAtMs || t.statusSinceMs)}`);
  if (t.status === "Stopping") return h("span", {}, `stopping ${since(t.statusSinceMs)}`);
  if (TERMINAL.includes(t.status)) {
    const ran = t.runStartedAtMs ? `ran ${duration(t.statusSinceMs - t.runStartedAtMs)}` : "did not run";
    return [h("span", {}, ran), h("div", { class: "muted" }, "ended ", moment(t.statusSinceMs))];
  }
  return null;
}

export async function taskList(params) {
  const tab = TABS.some(([id]) => id === params.get("tab")) ? params.get("tab") : "all";
  const at = location.hash;
  // Who is signed in, for the tabs that list by user or group (the first tab needs no extra request).
  let me = null;
  if (tab !== "all") {
    try {
      ({ data: me } = await api("GET", "/api/v1/whoami"));
    } catch (e) {
      // Those tabs say so below; the first still works.
    }
    // The user went elsewhere meanwhile: that page is drawn, not this one.
    if (location.hash !== at) return;
  }
  const myGroups = me?.groups || [];

  // The hash of this list with `changes` applied (a null value removes the parameter).
  const hashWith = (changes) => {
    const q = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "") q.delete(k);
      else q.set(k, v);
    }
    return `#/tasks${q.toString() ? `?${q}` : ""}`;
  };

  // ---- the tabs: each one a state of the URL, chosen with a click or the arrow keys (one tab stop) ----
  const tabIds = TABS.map(([id]) => id);
  const choose = (id, keyboard) => {
    if (id === tab) return;
    if (keyboard) focusTab = id;
    // The owner and group filters mean something else on each tab: they do not carry over.
    location.hash = hashWith({ tab: id === "all" ? null : id, owner: null, group: null });
  };
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Which tasks" },
    TABS.map(([id, label]) => h("button", {
      type: "button",
      role: "tab",
      id: `tab-${id}`,
      "aria-selected": id === tab ? "true" : "false",
      "aria-controls": "task-panel",
      tabindex: id === tab ? "0" : "-1",
      onclick: () => choose(id, false),
      onkeydown: (ev) => {
        const i = tabIds.indexOf(id);
        const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabIds.length - 1 }[ev.key];
        if (to === undefined) return;
        ev.preventDefault();
        const next = tabIds[(to + tabIds.length) % tabIds.length];
        if (next === tab) document.getElementById(`tab-${next}`).focus();
        else choose(next, true);
      },
    }, label)));

  // ---- the filters ----
  const field = (label, control) => h("label", {}, label, control);
  const select = (name, options) =>
    h("select", { name, id: `f-${name}` }, h("option", { value: "" }, "any"),
      options.map(([v, t]) => h("option", { value: v, selected: params.get(name) === v }, t)));
  const input = (name, placeholder) => h("input", { name, id: `f-${name}`, placeholder, value: params.get(name) || "" });
  const same = (vs) => vs.map((v) => [v, v]);
  const form = h("form", {
    class: "filters",
    role: "search",
    "aria-label": "Filter tasks",
    onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (tab !== "all") q.set("tab", tab);
      for (const [k, v] of new FormData(form)) if (v) q.set(k, /** @type {string} */ (v));
      location.hash = `#/tasks?${q}`;
    },
  },
    field("Name or ID", input("q", "search")),
    field("Status", select("status", same(["Queued", "Admitted", "Starting", "Prechecking", "Running", "Stopping", "Succeeded", "Failed", "Stopped"]))),
    field("Type", select("type", same(["PyTorchJob", "RayJob"]))),
    field("Accelerator", select("accelerator", [["gpu", "GPU"], ["cpu", "CPU only"]])),
    // Mine: the owner is the user. My project groups: a choice among them.
    tab === "mine" ? null : field("Owner", input("owner", "user")),
    tab === "groups"
      ? field("Project group", h("select", { name: "group", id: "f-group" }, h("option", { value: "" }, "any of mine"),
        myGroups.map((g) => h("option", { value: g, selected: params.get("group") === g }, g))))
      : field("Project group", input("group", "group")),
    field("Labels", input("labels", "key=value,...")),
    field("Sort", h("select", { name: "sort", id: "f-sort" }, [["newest", "newest first"], ["oldest", "oldest first"], ["name", "by name"], ["updated", "last changed"]].map(([v, t]) => h("option", { value: v, selected: (params.get("sort") || "newest") === v }, t)))),
    h("div", { class: "filter-buttons" }, h("button", { type: "submit" }, "Search")),
  );
  // The filters fold away on a phone, so the list is what it shows first; the summary says how many are set.
  const set = FILTERS.filter((f) => f !== "sort" && params.get(f)).length;
  const filters = h("details", { class: "filter-box", open: !matchMedia("(max-width: 600px)").matches },
    h("summary", {}, "Filters", set ? h("span", { class: "muted" }, ` · ${set} set`) : null),
    form);
  const refresh = h("button", { type: "button", id: "refresh", class: "secondary", onclick: () => load(null, true) }, "Refresh");

  // ---- tasks to compare: ticked by name, kept across the list's refreshes (which draw the rows again) ----
  const picked = new Set();
  const compare = h("button", { type: "button", id: "compare", class: "secondary", disabled: true, title: "Tick two or more tasks to compare their metrics", onclick: () => { location.hash = compareHash([...picked]); } }, "Compare");
  const pickBox = (t) => h("input", { type: "checkbox", class: "compare-pick", "aria-label": `compare ${t.name}`, checked: picked.has(t.name), onchange: (ev) => {
    if (ev.target.checked) picked.add(t.name);
    else picked.delete(t.name);
    compare.disabled = picked.size < 2;
    compare.textContent = picked.size ? `Compare (${picked.size})` : "Compare";
  } });

  // ---- the table ----
  const COLUMNS = ["Name", "Status", "Resources", "Duration", "Queue", "Type", "Owner", "Group", "Labels", "Created"];
  const body = h("tbody", { id: "task-rows" });
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  const status = h("p", { class: "muted list-status", "aria-live": "polite" });
  const table = h("table", { class: "tasks" },
    h("caption", {}, `Tasks: ${TABS.find(([id]) => id === tab)[1]}`),
    h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
    body);
  // Each cell names its column, for the stacked cards a phone shows instead of the table.
  const cell = (i, attrs, ...children) => h("td", { ...attrs, "data-label": COLUMNS[i] }, ...children);

  // The API's query for this tab and these filters; null when the tab cannot list anything.
  const query = () => {
    const q = new URLSearchParams();
    for (const f of FILTERS) if (params.get(f)) q.set(f, params.get(f));
    if (tab === "mine") {
      if (!me) return null;
      q.set("owner", me.name);
    } else if (tab === "groups") {
      if (!myGroups.length) return null;
      q.set("group", myGroups.includes(params.get("group")) ? params.get("group") : myGroups.join(","));
    }
    return q;
  };

  let cursor = null;
  async function load(from, replace) {
    const started = performance.now();
    const q = query();
    if (!q) {
      body.replaceChildren();
      status.replaceChildren(h("span", { id: "tasks-empty" }, me
        ? "You are in no project group yet; an admin adds you to one. "
        : "Who you are could not be read; ", h("a", { href: "#/tasks" }, "show all tasks you can see"), "."));
      return;
    }
    q.set("limit", "50");
    if (from) q.set("cursor", from);
    try {
      const { data } = await api("GET", `/api/v1/tasks?${q}`);
      const now = Date.now();
      const rows = data.items.map((t) =>
        h("tr", { "data-id": t.id },
          cell(0, { class: "name" }, pickBox(t), h("a", { href: `#/tasks/${encodeURIComponent(t.name)}` }, t.name), h("div", { class: "muted mono" }, t.id)),
          cell(1, {}, badge(t.status)),
          cell(2, { class: "resources" }, resources(t)),
          cell(3, { class: "duration" }, elapsed(t, now)),
          cell(4, { class: "queue" }, t.queue ? [h("strong", {}, `#${t.queue.position}`), ` (${t.queue.positionInGroup} in group) `, h("div", { class: "muted" }, t.queue.reason)] : null),
          cell(5, {}, t.type),
          cell(6, {}, t.owner),
          cell(7, {}, t.projectGroup),
          cell(8, { class: "labels" }, Object.entries(t.labels).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`))),
          cell(9, { class: "created" }, moment(t.createdAtMs))));
      if (replace) body.replaceChildren(...rows);
      else body.append(...rows);
      cursor = data.nextCursor;
      more.hidden = !cursor;
      if (body.children.length) status.textContent = `${body.children.length} task${body.children.length === 1 ? "" : "s"} shown`;
      else {
        // Nothing to show: say so, and where to go from here.
        const filtered = FILTERS.some((f) => f !== "sort" && params.get(f));
        const none = tab === "mine" ? "You have no tasks yet. " : tab === "groups" ? "Your project groups have no tasks yet. " : "There are no tasks yet. ";
        status.replaceChildren(h("span", { id: "tasks-empty" },
          filtered ? ["No tasks match these filters. ", h("a", { href: hashWith(Object.fromEntries(FILTERS.map((f) => [f, null]))) }, "Show all tasks"), " or "] : none,
          h("a", { href: "#/create", id: "tasks-empty-create" }, filtered ? "create one" : "Create one"), "."));
      }
      // For measuring: when a page of the list is in the document, and when its request began (console-bench
      // reads both).
      performance.mark("trainyard:tasks-rendered", { detail: { started } });
    } catch (e) {
      status.replaceChildren(fail(e));
    }
  }
  more.addEventListener("click", () => load(cursor, false));
  const panel = h("div", { role: "tabpanel", id: "task-panel", "aria-labelledby": `tab-${tab}` },
    filters, h("div", { class: "list-bar" }, status, h("div", { class: "list-actions" }, compare, refresh)), h("div", { class: "table-wrap" }, table), more);
  show(
    h("div", { class: "page-head" }, h("h1", {}, "Tasks"), h("a", { href: "#/create", id: "create-training", class: "button" }, "Create training")),
    tabs,
    panel,
  );
  if (focusTab) {
    document.getElementById(`tab-${focusTab}`)?.focus();
    focusTab = null;
  }
  load(null, true);
  repeat(() => { if (!cursor) load(null, true); }, 3000);
}
