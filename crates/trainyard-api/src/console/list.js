// The task list: filters in the URL, pages by cursor, refreshed while nothing more is loaded.

import { api, badge, fail, h, repeat, show, when } from "./core.js";

const FILTERS = ["q", "status", "type", "owner", "group", "labels", "sort"];

export function taskList(params) {
  const field = (name, label, control) => h("label", {}, label, control);
  const select = (name, options) =>
    h("select", { name, id: `f-${name}` }, h("option", { value: "" }, "any"), options.map((o) => h("option", { value: o, selected: params.get(name) === o }, o)));
  const input = (name, placeholder) => h("input", { name, id: `f-${name}`, placeholder, value: params.get(name) || "" });
  const form = h("form", {
    class: "filters",
    role: "search",
    onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
      location.hash = `#/tasks?${q}`;
    },
  },
    field("q", "Name or ID", input("q", "search")),
    field("status", "Status", select("status", ["Queued", "Admitted", "Starting", "Prechecking", "Running", "Stopping", "Succeeded", "Failed", "Stopped"])),
    field("type", "Type", select("type", ["PyTorchJob", "RayJob"])),
    field("owner", "Owner", input("owner", "user")),
    field("group", "Project group", input("group", "group")),
    field("labels", "Labels", input("labels", "key=value,...")),
    field("sort", "Sort", h("select", { name: "sort", id: "f-sort" }, [["newest", "newest first"], ["oldest", "oldest first"], ["name", "by name"], ["updated", "last changed"]].map(([v, t]) => h("option", { value: v, selected: (params.get("sort") || "newest") === v }, t)))),
    h("button", { type: "submit" }, "Search"),
    h("button", { type: "button", id: "refresh", onclick: () => load(null, true) }, "Refresh"),
  );
  const body = h("tbody", { id: "task-rows" });
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const table = h("table", { class: "tasks" },
    h("thead", {}, h("tr", {}, ["Name", "Type", "Status", "Queue", "Owner", "Group", "Labels", "Created"].map((c) => h("th", { scope: "col" }, c)))),
    body);
  let cursor = null;
  async function load(from, replace) {
    const started = performance.now();
    const q = new URLSearchParams();
    for (const f of FILTERS) if (params.get(f)) q.set(f, params.get(f));
    q.set("limit", "50");
    if (from) q.set("cursor", from);
    try {
      const { data } = await api("GET", `/api/v1/tasks?${q}`);
      const rows = data.items.map((t) =>
        h("tr", { "data-id": t.id },
          h("td", {}, h("a", { href: `#/tasks/${t.id}` }, t.name), h("div", { class: "muted mono" }, t.id)),
          h("td", {}, t.type),
          h("td", {}, badge(t.status)),
          h("td", { class: "queue" }, t.queue ? [h("strong", {}, `#${t.queue.position}`), ` (${t.queue.positionInGroup} in group) `, h("div", { class: "muted" }, t.queue.reason)] : ""),
          h("td", {}, t.owner),
          h("td", {}, t.projectGroup),
          h("td", {}, Object.entries(t.labels).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`))),
          h("td", {}, when(t.createdAtMs))));
      if (replace) body.replaceChildren(...rows);
      else body.append(...rows);
      cursor = data.nextCursor;
      more.hidden = !cursor;
      if (body.children.length) status.textContent = `${body.children.length} task${body.children.length === 1 ? "" : "s"} shown`;
      else {
        // Nothing to show: say so, and where to go from here.
        const filtered = FILTERS.some((f) => f !== "sort" && params.get(f));
        status.replaceChildren(h("span", { id: "tasks-empty" },
          filtered ? ["No tasks match these filters. ", h("a", { href: "#/tasks" }, "Show all tasks"), " or "] : "There are no tasks yet. ",
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
  show(h("h1", {}, "Tasks"), form, status, h("div", { class: "table-wrap" }, table), more);
  load(null, true);
  repeat(() => { if (!cursor) load(null, true); }, 3000);
}
