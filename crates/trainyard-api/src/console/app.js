// The Trainyard console: a hash-routed page over the HTTP API. DOM is built with `h` (never from HTML
// strings), so nothing a user typed is ever interpreted as markup.

const TOKEN_KEY = "trainyard.token";
const main = document.getElementById("main");
const TERMINAL = ["Succeeded", "Failed", "Stopped"];
let timer = null;

function h(tag, attrs = {}, ...children) {
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

function token() {
  return localStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, body) {
    super(body?.detail || body?.title || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body, headers = {}) {
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
  let data = text;
  if ((r.headers.get("content-type") || "").includes("json")) data = text ? JSON.parse(text) : null;
  if (!r.ok) throw new ApiError(r.status, data);
  return { data, headers: r.headers, status: r.status };
}

function badge(status) {
  return h("span", { class: `badge ${status.toLowerCase()}`, "data-status": status }, status);
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

function show(...nodes) {
  clearInterval(timer);
  timer = null;
  main.replaceChildren(...nodes);
}

function fail(e) {
  return h("p", { class: "error", role: "alert" }, e.message || String(e));
}

// ---- sign-in ---------------------------------------------------------------------------------------------

async function whoami() {
  const who = document.getElementById("who");
  const nav = document.getElementById("nav");
  if (!token()) {
    who.replaceChildren();
    nav.hidden = true;
    return null;
  }
  try {
    const { data } = await api("GET", "/api/v1/whoami");
    nav.hidden = false;
    who.replaceChildren(
      h("span", { id: "who-name" }, data.name),
      h("span", { class: "muted" }, ` ${data.role} · ${data.groups.join(", ") || "no group"} `),
      h("button", { type: "button", class: "link", onclick: () => { localStorage.removeItem(TOKEN_KEY); location.hash = "#/signin"; } }, "Sign out"),
    );
    return data;
  } catch (e) {
    return null;
  }
}

function signin() {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const msg = h("p", { role: "alert" });
  const form = h("form", {
    class: "card narrow",
    onsubmit: async (ev) => {
      ev.preventDefault();
      localStorage.setItem(TOKEN_KEY, input.value.trim());
      const me = await whoami();
      if (me) location.hash = "#/tasks";
      else {
        localStorage.removeItem(TOKEN_KEY);
        msg.textContent = "That token was not accepted.";
        msg.className = "error";
      }
    },
  },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { class: "muted" }, "The token `trainyard up` printed, or one an admin made for you."),
    h("button", { type: "submit", id: "signin" }, "Sign in"),
    msg,
  );
  show(form);
  input.focus();
}

// ---- task list -------------------------------------------------------------------------------------------

const FILTERS = ["q", "status", "type", "owner", "group", "labels"];

function taskList(params) {
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
      status.textContent = body.children.length ? `${body.children.length} tasks shown` : "No tasks match.";
    } catch (e) {
      status.replaceChildren(fail(e));
    }
  }
  more.addEventListener("click", () => load(cursor, false));
  show(h("h1", {}, "Tasks"), form, status, table, more);
  load(null, true);
  timer = setInterval(() => { if (!cursor) load(null, true); }, 3000);
}

// ---- one task --------------------------------------------------------------------------------------------

function sparkline(points) {
  const w = 160, hgt = 32;
  if (points.length < 2) return h("span", { class: "muted" }, "");
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const sx = (x) => ((x - x0) / (x1 - x0 || 1)) * (w - 2) + 1;
  const sy = (y) => hgt - 1 - ((y - y0) / (y1 - y0 || 1)) * (hgt - 2);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", hgt);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `from ${ys[0]} to ${ys[ys.length - 1]}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "currentColor");
  svg.append(line);
  return svg;
}

async function taskPage(id) {
  const head = h("div", { class: "task-head" });
  const overview = h("dl", { class: "overview" });
  const actions = h("div", { class: "actions" });
  const replicas = h("tbody", {});
  const events = h("ol", { class: "events", id: "events" });
  const spec = h("pre", { class: "spec" });
  const metrics = h("tbody", {});
  const logSelect = h("select", { id: "log-replica", "aria-label": "replica" });
  const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  const log = h("pre", { class: "log", id: "log", tabindex: "0" });
  const download = h("a", { href: "#", id: "log-download" }, "Download");
  let task = null;
  let logAbort = null;

  async function act(what, method, path, confirmText) {
    if (!confirm(confirmText)) return;
    try {
      const { data } = await api(method, path);
      if (what === "clone") location.hash = `#/tasks/${data.id}`;
      else if (what === "delete") location.hash = "#/tasks";
      else refresh();
    } catch (e) {
      actions.append(fail(e));
    }
  }

  async function followLog() {
    if (logAbort) logAbort.abort();
    const [attempt, replica] = (logSelect.value || "").split("/");
    if (!replica) return;
    log.textContent = "";
    const base = `/api/v1/tasks/${id}/logs?replica=${encodeURIComponent(replica)}&attempt=${attempt}`;
    if (!follow.checked) {
      const { data } = await api("GET", base);
      log.textContent = data;
      return;
    }
    logAbort = new AbortController();
    try {
      const r = await fetch(`${base}&follow=true`, { headers: { Authorization: `Bearer ${token()}` }, signal: logAbort.signal });
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (ev.startsWith("event: end")) continue;
          const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (data) {
            const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
            log.append(data + "\n");
            if (atEnd) log.scrollTop = log.scrollHeight;
          }
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") log.append(`\n(${e.message})`);
    }
  }

  async function loadLogs() {
    try {
      const { data } = await api("GET", `/api/v1/tasks/${id}/logs`);
      const current = logSelect.value;
      const options = data.items.flatMap((a) => a.replicas.map((r) => h("option", { value: `${a.attempt}/${r.name}` }, `attempt ${a.attempt} · ${r.name} (${r.role})`)));
      if (options.length !== logSelect.options.length) {
        logSelect.replaceChildren(...options);
        if (current && [...logSelect.options].some((o) => o.value === current)) logSelect.value = current;
        else if (!current && options.length) followLog();
      }
    } catch (e) { /* logs appear once replicas exist */ }
  }

  async function loadMetrics() {
    try {
      const { data } = await api("GET", `/api/v1/tasks/${id}/metrics`);
      metrics.replaceChildren(...data.series.map((s) => {
        const last = s.points[s.points.length - 1];
        const labels = Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ");
        return h("tr", {}, h("td", {}, s.replica), h("td", { class: "mono" }, s.name, labels ? h("div", { class: "muted" }, labels) : ""), h("td", {}, last ? Number(last[1]).toPrecision(4) : ""), h("td", {}, sparkline(s.points)));
      }));
    } catch (e) { /* none yet */ }
  }

  async function refresh() {
    try {
      const [{ data: t }, { data: ev }] = await Promise.all([api("GET", `/api/v1/tasks/${id}`), api("GET", `/api/v1/tasks/${id}/events`)]);
      task = t;
      head.replaceChildren(h("h1", {}, t.name, " ", badge(t.status)), h("div", { class: "muted mono" }, t.id));
      const dd = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      overview.replaceChildren(
        ...dd("Type", t.type), ...dd("Owner", t.owner), ...dd("Project group", t.projectGroup),
        ...dd("Attempt", `${t.attempt} (${t.retries} automatic resubmissions)`),
        ...dd("Created", when(t.createdAtMs)), ...dd("Updated", when(t.updatedAtMs)),
        ...dd("Queue", t.queue ? `#${t.queue.position} (${t.queue.positionInGroup} in its group): ${t.queue.reason}` : "—"),
        ...dd("Resources", t.placement?.units ? t.placement.units.map(([s, c, u]) => `${u} ${c} units of ${s}`).join(", ") : "—"),
      );
      replicas.replaceChildren(...(t.placement?.replicas || []).map((r) => h("tr", {}, h("td", {}, `${r.role}-${r.index}`), h("td", {}, r.rank), h("td", {}, r.node), h("td", {}, `${r.resources.vcpus} vCPU, ${r.resources.memoryMib} MiB, ${r.resources.gpus} GPU`))));
      events.replaceChildren(...ev.items.map((e) => h("li", { "data-reason": e.reason }, h("time", {}, when(e.atMs)), " ", h("strong", {}, e.reason), ` (attempt ${e.attempt}) `, e.message)));
      spec.textContent = JSON.stringify(t.spec, null, 2);
      const running = !TERMINAL.includes(t.status);
      actions.replaceChildren(
        running ? h("button", { type: "button", id: "act-stop", onclick: () => act("stop", "POST", `/api/v1/tasks/${id}/stop`, `Stop ${t.name}? Replicas get the checkpoint notice if it is on.`) }, "Stop") : "",
        !running ? h("button", { type: "button", id: "act-resubmit", onclick: () => act("resubmit", "POST", `/api/v1/tasks/${id}/resubmit`, `Resubmit ${t.name} as a new attempt?`) }, "Resubmit") : "",
        h("button", { type: "button", id: "act-clone", onclick: () => act("clone", "POST", `/api/v1/tasks/${id}/clone`, `Create a new task from ${t.name}'s spec?`) }, "Clone"),
        h("button", { type: "button", id: "act-delete", class: "danger", onclick: () => act("delete", "DELETE", `/api/v1/tasks/${id}`, `Delete ${t.name}? Its history stays, the task leaves the list.`) }, "Delete"),
      );
      await Promise.all([loadLogs(), loadMetrics()]);
      if (!running) { clearInterval(timer); timer = null; }
    } catch (e) {
      head.replaceChildren(fail(e));
    }
  }

  logSelect.addEventListener("change", followLog);
  follow.addEventListener("change", followLog);
  download.addEventListener("click", async (ev) => {
    ev.preventDefault();
    const [attempt, replica] = (logSelect.value || "").split("/");
    if (!replica) return;
    const { data } = await api("GET", `/api/v1/tasks/${id}/logs?replica=${encodeURIComponent(replica)}&attempt=${attempt}`);
    const a = h("a", { href: URL.createObjectURL(new Blob([data], { type: "text/plain" })), download: `${replica}-attempt-${attempt}.log` });
    a.click();
  });

  show(
    head, actions,
    h("section", {}, h("h2", {}, "Overview"), overview),
    h("section", {}, h("h2", {}, "Replicas"), h("table", {}, h("thead", {}, h("tr", {}, ["Replica", "Rank", "Node", "Resources"].map((c) => h("th", { scope: "col" }, c)))), replicas)),
    h("section", {}, h("h2", {}, "Events"), events),
    h("section", {}, h("h2", {}, "Logs"), h("div", { class: "log-bar" }, logSelect, h("label", {}, follow, " follow"), download), log),
    h("section", {}, h("h2", {}, "Metrics"), h("table", {}, h("thead", {}, h("tr", {}, ["Replica", "Metric", "Last", "Trend"].map((c) => h("th", { scope: "col" }, c)))), metrics)),
    h("section", {}, h("h2", {}, "Spec"), h("p", { class: "muted" }, "Hidden values are masked."), spec),
  );
  await refresh();
  timer = setInterval(refresh, 2000);
}

// ---- a new task from a document -------------------------------------------------------------------------

function newTask() {
  const doc = h("textarea", { id: "doc", rows: 24, spellcheck: "false", "aria-describedby": "problems" });
  const problems = h("ul", { id: "problems", class: "problems", "aria-live": "polite" });
  const demand = h("div", { id: "demand" });
  const submit = h("button", { type: "submit", id: "submit" }, "Submit");
  const file = h("input", { type: "file", id: "import", accept: ".yaml,.yml,.json" });
  // One key per document: a double click or a resubmitted form returns the same task.
  let key = crypto.randomUUID();
  let checkTimer = null;
  async function check() {
    try {
      const { data } = await api("POST", "/api/v1/validate", doc.value);
      problems.replaceChildren(...data.problems.map((p) => h("li", { class: p.severity, "data-path": p.path }, h("code", {}, p.path || "(document)"), ` ${p.message}`)));
      demand.replaceChildren(...(data.demand || []).map((d) => h("p", {}, `Option ${d.option + 1}: ${d.replicas} replicas, ${d.total.gpus} GPUs, ${d.total.vcpus} vCPU, ${d.total.memoryMib} MiB`)));
      return data.valid;
    } catch (e) {
      problems.replaceChildren(h("li", {}, e.message));
      return false;
    }
  }
  doc.addEventListener("input", () => {
    key = crypto.randomUUID();
    clearTimeout(checkTimer);
    checkTimer = setTimeout(check, 300);
  });
  file.addEventListener("change", async () => {
    if (file.files[0]) {
      doc.value = await file.files[0].text();
      key = crypto.randomUUID();
      check();
    }
  });
  const form = h("form", {
    onsubmit: async (ev) => {
      ev.preventDefault();
      submit.disabled = true;
      try {
        const { data } = await api("POST", "/api/v1/tasks", doc.value, { "Idempotency-Key": key });
        location.hash = `#/tasks/${data.id}`;
      } catch (e) {
        if (e.body?.problems) problems.replaceChildren(...e.body.problems.map((p) => h("li", { class: p.severity, "data-path": p.path }, h("code", {}, p.path), ` ${p.message}`)));
        else problems.replaceChildren(h("li", {}, e.message));
      } finally {
        submit.disabled = false;
      }
    },
  },
    h("label", { for: "doc" }, "Task document (YAML or JSON)"), doc,
    h("div", { class: "row" }, h("label", {}, "Import a file ", file), submit),
  );
  show(h("h1", {}, "New task"), form, h("h2", {}, "Problems"), problems, h("h2", {}, "Demand"), demand);
  const from = sessionStorage.getItem("trainyard.clone");
  if (from) { doc.value = from; sessionStorage.removeItem("trainyard.clone"); check(); }
  doc.focus();
}

// ---- routing ---------------------------------------------------------------------------------------------

async function route() {
  const [path, query] = location.hash.slice(1).split("?");
  if (!token() && path !== "/signin") { location.hash = "#/signin"; return; }
  if (path === "/signin") return signin();
  await whoami();
  const m = path.match(/^\/tasks\/([^/]+)$/);
  if (m) return taskPage(decodeURIComponent(m[1]));
  if (path === "/new") return newTask();
  return taskList(new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);
route();
