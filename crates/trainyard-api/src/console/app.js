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
    document.getElementById("nav-admin").hidden = data.role !== "admin";
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

const FILTERS = ["q", "status", "type", "owner", "group", "labels", "sort"];

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

// What ended an attempt: the first of these among its events (a NodeFailed is followed by Terminated, say).
const ENDINGS = ["Completed", "UserError", "OutOfMemory", "ImagePullFailed", "PrecheckFailed", "NodeFailed", "Preempted", "StopRequested", "Deleted", "RetryBudgetSpent", "Terminated"];

// The attempts of a task from its events (each carries its attempt number) and, for the current attempt, its
// placement: when it was queued, admitted, running, when it ended and why, and on which nodes. An earlier
// attempt's nodes are read from its Admitted event ("on node-a, node-b with ...").
function attemptsOf(t, events) {
  const by = new Map();
  for (const e of events) {
    if (!by.has(e.attempt)) by.set(e.attempt, []);
    by.get(e.attempt).push(e);
  }
  if (!by.has(t.attempt)) by.set(t.attempt, []);
  return [...by.keys()].sort((a, b) => a - b).map((n) => {
    const evs = by.get(n);
    const at = (...reasons) => evs.find((e) => reasons.includes(e.reason));
    const admitted = at("Admitted");
    const running = at("Started", "PrecheckPassed");
    const cause = evs.find((e) => ENDINGS.includes(e.reason));
    const current = n === t.attempt;
    let nodes = [];
    if (current && t.placement?.replicas) nodes = [...new Set(t.placement.replicas.map((r) => r.node))];
    else if (admitted) nodes = (admitted.message.match(/^on (.+?) with /)?.[1] || "").split(", ").filter(Boolean);
    // Ended: an earlier attempt always; the current one once the task is done.
    const ended = !current || TERMINAL.includes(t.status);
    const last = evs[evs.length - 1];
    // An earlier attempt was retried (Requeued opens the next one) or had ended before a person resubmitted.
    const next = by.get([...by.keys()].filter((k) => k > n).sort((a, b) => a - b)[0])?.[0];
    let outcome = t.status;
    if (!current) {
      if (next?.reason === "Requeued") outcome = "Requeued";
      else if (cause?.reason === "Completed") outcome = "Succeeded";
      else if (["StopRequested", "Deleted", "Terminated"].includes(cause?.reason)) outcome = "Stopped";
      else outcome = "Failed";
    }
    return { n, current, queuedAt: evs[0]?.atMs, admittedAt: admitted?.atMs, runningAt: running?.atMs, endedAt: ended ? last?.atMs : null, outcome, cause, nodes };
  });
}

async function taskPage(id) {
  const head = h("div", { class: "task-head" });
  const overview = h("dl", { class: "overview" });
  const actions = h("div", { class: "actions" });
  const replicas = h("tbody", {});
  const attempts = h("tbody", { id: "attempts" });
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
      // A deleted task is still read by id (one deleted while it ran is followed to its end): said so, and
      // not offered to resubmit or delete again.
      const deleted = t.deleted ? [" ", h("span", { class: "badge deleted", "data-status": "deleted" }, "deleted")] : "";
      head.replaceChildren(h("h1", {}, t.name, " ", badge(t.status), deleted), h("div", { class: "muted mono" }, t.id));
      const dd = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      overview.replaceChildren(
        ...dd("Type", t.type), ...dd("Owner", t.owner), ...dd("Project group", t.projectGroup),
        ...dd("Attempt", `${t.attempt} (${t.retries} automatic resubmissions)`),
        ...dd("Created", when(t.createdAtMs)), ...dd("Updated", when(t.updatedAtMs)),
        ...dd("Queue", t.queue ? `#${t.queue.position} (${t.queue.positionInGroup} in its group): ${t.queue.reason}` : "—"),
        ...dd("Resources", t.placement?.units ? t.placement.units.map(([s, c, u]) => `${u} ${c} units of ${s}`).join(", ") : "—"),
      );
      replicas.replaceChildren(...(t.placement?.replicas || []).map((r) => h("tr", {}, h("td", {}, `${r.role}-${r.index}`), h("td", {}, r.rank), h("td", {}, r.node), h("td", {}, `${r.resources.vcpus} vCPU, ${r.resources.memoryMib} MiB, ${r.resources.gpus} GPU`))));
      const time = (ms) => (ms ? h("time", { datetime: new Date(ms).toISOString() }, when(ms)) : "—");
      attempts.replaceChildren(...attemptsOf(t, ev.items).reverse().map((a) => h("tr", { "data-attempt": a.n, class: a.current ? "current" : "" },
        h("td", {}, String(a.n), a.current ? h("span", { class: "muted" }, " (current)") : ""),
        h("td", {}, time(a.queuedAt)),
        h("td", {}, time(a.admittedAt), a.runningAt ? h("div", { class: "muted" }, "running ", time(a.runningAt)) : ""),
        h("td", {}, a.endedAt ? time(a.endedAt) : "—"),
        h("td", { class: "outcome" }, badge(a.outcome), a.cause ? [" ", h("strong", { "data-reason": a.cause.reason }, a.cause.reason), h("div", { class: "muted" }, a.cause.message)] : ""),
        h("td", { class: "nodes" }, a.nodes.join(", ") || "—"))));
      events.replaceChildren(...ev.items.map((e) => h("li", { "data-reason": e.reason }, h("time", {}, when(e.atMs)), " ", h("strong", {}, e.reason), ` (attempt ${e.attempt}) `, e.message)));
      spec.textContent = JSON.stringify(t.spec, null, 2);
      const running = !TERMINAL.includes(t.status);
      actions.replaceChildren(
        running ? h("button", { type: "button", id: "act-stop", onclick: () => act("stop", "POST", `/api/v1/tasks/${id}/stop`, `Stop ${t.name}? Replicas get the checkpoint notice if it is on.`) }, "Stop") : "",
        !running && !t.deleted ? h("button", { type: "button", id: "act-resubmit", onclick: () => act("resubmit", "POST", `/api/v1/tasks/${id}/resubmit`, `Resubmit ${t.name} as a new attempt?`) }, "Resubmit") : "",
        h("button", { type: "button", id: "act-clone", onclick: () => { location.hash = `#/create?from=${encodeURIComponent(id)}`; } }, "Clone"),
        h("button", { type: "button", id: "act-share", onclick: async () => {
          const user = prompt(`Share ${t.name} with which user?`);
          if (!user) return;
          const operate = confirm(`May ${user} also operate it (stop, resubmit, delete)? OK for view and operate, Cancel for view only.`);
          try {
            await api("POST", `/api/v1/tasks/${id}/shares`, JSON.stringify({ user, operate }), { "Content-Type": "application/json" });
            actions.append(h("span", { class: "muted" }, ` shared with ${user}${operate ? " (view and operate)" : " (view)"}`));
          } catch (e) { actions.append(fail(e)); }
        } }, "Share"),
        t.deleted ? "" : h("button", { type: "button", id: "act-delete", class: "danger", onclick: () => act("delete", "DELETE", `/api/v1/tasks/${id}`, `Delete ${t.name}? Its history stays, the task leaves the list.`) }, "Delete"),
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
    h("section", {}, h("h2", { id: "attempts-title" }, "Attempts"), h("table", { class: "attempts", "aria-labelledby": "attempts-title" }, h("thead", {}, h("tr", {}, ["Attempt", "Queued", "Started", "Ended", "How it ended", "Nodes"].map((c) => h("th", { scope: "col" }, c)))), attempts)),
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
    h("div", { class: "row" }, h("label", {}, "Import a file ", file),
      h("button", { type: "button", id: "to-form", onclick: async () => {
        if (!doc.value.trim()) { problems.replaceChildren(h("li", {}, "The document is empty: type or import one first.")); return; }
        const { data } = await api("POST", "/api/v1/validate", doc.value);
        if (!data.task) { problems.replaceChildren(h("li", {}, "The document cannot be read; fix the problems first.")); return; }
        sessionStorage.setItem("trainyard.form", JSON.stringify(data.task));
        location.hash = "#/create";
      } }, "Open in the form"),
      submit),
  );
  show(h("h1", {}, "New task"), form, h("h2", {}, "Problems"), problems, h("h2", {}, "Demand"), demand);
  const from = sessionStorage.getItem("trainyard.clone");
  if (from) { doc.value = from; sessionStorage.removeItem("trainyard.clone"); check(); }
  doc.focus();
}

// ---- the Create Training form ----------------------------------------------------------------------------
// Sections in the order of the product page: basic information, environment, compute resources, advanced
// options, then the PyTorchJob or RayJob part. Every input is bound to a path in the task document; the
// server's validator answers as the user types and each problem is shown at the field its path names.

function getPath(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

function setPath(obj, path, value) {
  const keys = path.split(".");
  let o = obj;
  for (const k of keys.slice(0, -1)) {
    if (o[k] == null || typeof o[k] !== "object") o[k] = /^\d+$/.test(k) ? [] : {};
    o = o[k];
  }
  const last = keys[keys.length - 1];
  if (value === undefined) {
    if (Array.isArray(o)) o.splice(Number(last), 1);
    else delete o[last];
  } else o[last] = value;
}

// `a.b[2].c` (the validator's paths) to `a.b.2.c` (ours).
const dotted = (p) => p.replace(/\[(\d+)\]/g, ".$1");

// A path from parts, each slash once: joinPath("/volume/", "/data") is "/volume/data".
const joinPath = (...parts) => `/${parts.flatMap((x) => String(x).split("/")).filter(Boolean).join("/")}`;

function defaultDoc(cat, me) {
  const region = Object.keys(cat.regions)[0] || "";
  const cluster = Object.entries(cat.clusters).find(([, c]) => c.region === region)?.[0] || "";
  const pool = Object.entries(cat.pools).find(([, p]) => p.cluster === cluster)?.[0] || "";
  const spec = cat.pools[pool]?.instanceSpecs?.[0] || "";
  return {
    apiVersion: "trainyard.dev/v1",
    kind: "TrainingTask",
    metadata: { namePrefix: "", projectGroup: me?.groups?.[0] || Object.keys(cat.projectGroups)[0] || "", public: false, labels: {} },
    spec: {
      type: "PyTorchJob",
      placement: { region, cluster },
      environment: { image: cat.images.host ? "host" : Object.keys(cat.images)[0] || "", env: [], volumes: [], datasets: [], models: [], cmd: "" },
      compute: { resourceType: "Reserved", pool, workers: 0, instanceSpecs: [{ spec, countPerNode: 1 }] },
      advanced: { imagePullTolerance: 3, passwordlessSsh: false, alarms: [] },
    },
  };
}

async function createPage(params) {
  const [{ data: cat }, { data: me }] = await Promise.all([api("GET", "/api/v1/catalog"), api("GET", "/api/v1/whoami")]);
  let doc = defaultDoc(cat, me);
  const from = params.get("from");
  let cloneNote = "";
  // Problems show at a field once it was touched (typed in, changed, a button in it pressed) or Create was
  // pressed; until then the validator still answers in the background (the demand panel needs it).
  const touched = new Set();
  let attempted = false;
  if (from) {
    const { data: t } = await api("GET", `/api/v1/tasks/${encodeURIComponent(from)}`);
    doc = t.spec;
    // A copy never carries hidden values (the API shows them masked and refuses a mask as a value): each
    // starts empty, and the form asks for it again.
    // The form asks for them: their problems show from the start.
    const asked = [];
    for (const [base, vars] of [["spec.environment.env", doc.spec.environment?.env], ["spec.advanced.precheck.env", doc.spec.advanced?.precheck?.env]]) {
      (vars || []).forEach((v, i) => {
        if (v.hidden) { v.value = ""; asked.push(v.name); touched.add(`${base}.${i}.value`); }
      });
    }
    if (asked.length) cloneNote = `Hidden values are not copied: enter ${asked.join(", ")} again.`;
    // A copy goes to one of your own project groups (admins: any), as a new task would.
    if (me.role !== "admin" && !me.groups.includes(doc.metadata.projectGroup)) doc.metadata.projectGroup = me.groups[0] || "";
  } else if (sessionStorage.getItem("trainyard.form")) {
    doc = JSON.parse(sessionStorage.getItem("trainyard.form"));
    sessionStorage.removeItem("trainyard.form");
  }
  let key = crypto.randomUUID();
  let timer = null;
  const form = h("form", { id: "create", novalidate: true });
  // Touched: the field an edit was in and every enclosing one (read in the capture phase, before a
  // handler draws the form again).
  const touch = (ev) => {
    if (ev.type === "click" && !ev.target.closest("button")) return;
    for (let e = ev.target.closest("[data-path]"); e; e = e.parentElement?.closest("[data-path]")) touched.add(e.dataset.path);
  };
  for (const type of ["input", "change", "click"]) form.addEventListener(type, touch, true);
  const problems = h("ul", { id: "problems", class: "problems", "aria-live": "polite" });
  const summary = h("div", { id: "summary", class: "card" });
  let quota = [];
  // The user's TaskEnv before the first render: drawing the form again when it arrives would replace the
  // inputs under the user's hands.
  const inherited = await api("GET", `/api/v1/users/${encodeURIComponent(me.name)}/env`).then(({ data }) => data.items || [], () => []);
  const recentImages = await api("GET", `/api/v1/users/${encodeURIComponent(me.name)}/images`).then(({ data }) => (data.items || []).map((x) => x.image), () => []);
  api("GET", "/api/v1/quota").then(({ data }) => { quota = data.items; check(); }).catch(() => {});

  const changed = (rerender) => {
    key = crypto.randomUUID();
    if (rerender) render();
    clearTimeout(timer);
    timer = setTimeout(check, 250);
  };
  const field = (path, label, input, hint) =>
    h("div", { class: "field", "data-path": path }, h("label", { for: `in-${path}` }, label), input, hint ? h("div", { class: "muted" }, hint) : "");
  const text = (path, label, opts = {}) => {
    const v = getPath(doc, path);
    const input = h(opts.multiline ? "textarea" : "input", { id: `in-${path}`, value: opts.multiline ? undefined : v ?? "", rows: opts.rows, placeholder: opts.placeholder, spellcheck: "false" });
    if (opts.multiline) input.value = v ?? "";
    input.addEventListener("input", () => { setPath(doc, path, input.value === "" && opts.optional ? undefined : input.value); changed(false); });
    return field(path, label, input, opts.hint);
  };
  const num = (path, label, opts = {}) => {
    const v = getPath(doc, path);
    const input = h("input", { id: `in-${path}`, type: "number", value: v ?? "", min: opts.min, step: opts.step || 1, placeholder: opts.placeholder });
    input.addEventListener("input", () => { setPath(doc, path, input.value === "" ? undefined : Number(input.value)); changed(false); });
    return field(path, label, input, opts.hint);
  };
  const check1 = (path, label, rerender) => {
    const input = h("input", { id: `in-${path}`, type: "checkbox", checked: !!getPath(doc, path) });
    input.addEventListener("change", () => { setPath(doc, path, input.checked); changed(rerender); });
    return h("div", { class: "field check", "data-path": path }, input, h("label", { for: `in-${path}` }, label));
  };
  const select = (path, label, options, rerender, hint, none) => {
    const v = getPath(doc, path);
    if (!options.length) {
      return h("div", { class: "field", "data-path": path }, h("span", { class: "label-text" }, label),
        h("p", { class: "muted empty", "data-empty": path }, none || "Nothing to choose from; an admin adds entries to the catalog."));
    }
    const input = h("select", { id: `in-${path}` }, options.map((o) => h("option", { value: o, selected: o === v }, o)));
    if (!options.includes(v) && options.length) setPath(doc, path, input.value);
    input.addEventListener("change", () => { setPath(doc, path, input.value); changed(rerender); });
    return field(path, label, input, hint);
  };
  // The image: a preset of the catalog (offered in this cluster and group), one the user's tasks ran lately, or
  // an address typed in (`registry/repository:tag` or `...@sha256:...`) when the catalog allows them. The
  // validator checks the address's syntax and its registry as it is typed; its problem shows under the field.
  const imagePicker = (hint) => {
    const path = "spec.environment.image";
    const presets = inCluster(cat.images);
    const recent = recentImages.filter((x) => !presets.includes(x) && (cat.allowExternalImages || x in cat.images));
    const input = h("input", { id: `in-${path}`, value: getPath(doc, path) ?? "", list: "image-choices", spellcheck: "false", autocomplete: "off",
      placeholder: cat.allowExternalImages ? "a preset, or registry/repository:tag" : "a preset image" });
    input.addEventListener("input", () => { setPath(doc, path, input.value.trim()); changed(false); });
    const describe = (name) => {
      const x = cat.images[name] || {};
      return [x.reference || (name === "host" ? "this machine's system" : ""), x.torch ? "PyTorch" : "", x.ray ? "Ray" : ""].filter(Boolean).join(" · ");
    };
    const choices = h("datalist", { id: "image-choices" },
      presets.map((n) => h("option", { value: n, "data-kind": "preset" }, `preset${describe(n) ? `: ${describe(n)}` : ""}`)),
      recent.map((n) => h("option", { value: n, "data-kind": "recent" }, "recently used")));
    const registries = Object.keys(cat.registries || {});
    const none = !presets.length && !recent.length && !cat.allowExternalImages;
    const hints = [hint,
      none ? "No images in the catalog for this cluster and project group; an admin adds them." : "",
      presets.length ? `Presets: ${presets.join(", ")}.` : "",
      recent.length ? `Recently used: ${recent.join(", ")}.` : "",
      cat.allowExternalImages ? `Or an image address${registries.length ? ` from ${registries.join(", ")}` : ""}; the task runs its command with bash -c, so the image needs bash.` : ""].filter(Boolean).join(" ");
    return h("div", { class: "field", "data-path": path, id: "image-picker" }, h("label", { for: `in-${path}` }, "Image"), input, choices,
      h("div", { class: none ? "muted empty" : "muted", "data-empty": none ? path : undefined }, hints));
  };
  // An optional block (precheck, fault tolerance, ...): present in the document only when switched on.
  const block = (path, label, defaults, body) => {
    const on = getPath(doc, path) != null && getPath(doc, path).enabled !== false;
    const input = h("input", { id: `in-${path}.enabled`, type: "checkbox", checked: on });
    input.addEventListener("change", () => { setPath(doc, path, input.checked ? { enabled: true, ...defaults } : undefined); changed(true); });
    return h("fieldset", { "data-path": path }, h("legend", {}, input, h("label", { for: `in-${path}.enabled` }, label)), on ? body() : "");
  };
  // `none`: when set, there is nothing to add (say, no volume in the catalog): the sentence instead of Add.
  const list = (path, label, make, row, none) => {
    const items = getPath(doc, path) || [];
    return h("fieldset", { "data-path": path }, h("legend", {}, label),
      items.map((_, i) => h("div", { class: "row-item", "data-path": `${path}.${i}` }, row(`${path}.${i}`),
        h("button", { type: "button", class: "link", "aria-label": `remove ${label} ${i + 1}`, onclick: () => { items.splice(i, 1); setPath(doc, path, items); changed(true); } }, "Remove"))),
      none
        ? h("p", { class: "muted empty", "data-empty": path }, none)
        : h("button", { type: "button", class: "add", id: `add-${path}`, onclick: () => { items.push(make()); setPath(doc, path, items); changed(true); } }, `Add ${label.toLowerCase().replace(/s$/, "")}`));
  };
  const noneIn = (kind, m) => (inCluster(m).length ? "" : `No ${kind} in the catalog for this cluster and project group; an admin adds them.`);
  // A volume row: its mount path starts as /volume/NAME and follows the volume chosen until it is edited.
  const volumeRow = (p) => {
    const f = select(`${p}.volume`, "Volume", inCluster(cat.volumes));
    const sel = f.querySelector("select");
    let prev = getPath(doc, `${p}.volume`);
    sel?.addEventListener("change", () => {
      if (getPath(doc, `${p}.mountPath`) === joinPath("/volume", prev)) {
        setPath(doc, `${p}.mountPath`, joinPath("/volume", sel.value));
        const mp = document.getElementById(`in-${p}.mountPath`);
        if (mp) mp.value = joinPath("/volume", sel.value);
      }
      prev = sel.value;
    });
    return [f, text(`${p}.mountPath`, "Mount path"), check1(`${p}.readOnly`, "Read-only")];
  };
  // Catalog entries offered in the task's cluster and to its project group (empty lists: all); the host image
  // is for admins and the groups its entry lists.
  const usable = (m, k, x) => (m === cat.images && k === "host"
    ? me.role === "admin" || (x.projectGroups || []).includes(doc.metadata.projectGroup)
    : !x.projectGroups?.length || x.projectGroups.includes(doc.metadata.projectGroup));
  const inCluster = (m) => Object.entries(m || {}).filter(([k, x]) => (!x.clusters?.length || x.clusters.includes(doc.spec.placement.cluster)) && usable(m, k, x)).map(([k]) => k);

  // The validator's path for a label key: `metadata.labels.team`, or `metadata.labels["app.io/x"]` for keys
  // that are not plain identifiers (as `trainyard_core::problem::key` writes them), so problems land on the row.
  const labelPath = (k) => (/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) ? `metadata.labels.${k}` : `metadata.labels[${JSON.stringify(k)}]`);

  // Labels: keys offered from the catalog's maintained labels; a maintained key with allowed values offers them
  // as choices (a select while label validation is on, suggestions while it is off). A value that is not
  // allowed (from a clone or an imported document) stays visible, and the validator's problem shows at its row.
  function labelsEditor() {
    const policy = cat.labels || {};
    const maintained = policy.maintained || {};
    const rows = Object.entries(doc.metadata.labels || {});
    const put = (i, k, v, rerender) => {
      const next = Object.entries(doc.metadata.labels || {});
      next[i] = [k, v];
      doc.metadata.labels = Object.fromEntries(next);
      changed(rerender);
    };
    return h("fieldset", { "data-path": "metadata.labels", id: "labels" },
      h("legend", {}, "Labels", policy.validation ? h("span", { class: "muted" }, " (maintained labels only)") : ""),
      rows.map(([k, v], i) => {
        const allowed = maintained[k] || [];
        const kin = h("input", { id: `label-key-${i}`, "aria-label": `label ${i + 1} key`, value: k, list: "maintained-labels", spellcheck: "false" });
        // A new key may bring other choices for the value: render again.
        kin.addEventListener("change", () => put(i, kin.value.trim(), v, true));
        let vin;
        if (allowed.length && policy.validation) {
          vin = h("select", { id: `label-value-${i}`, "aria-label": `label ${i + 1} value` },
            allowed.includes(v) ? "" : h("option", { value: v, selected: true }, v === "" ? "choose a value" : `${v} (not allowed)`),
            allowed.map((a) => h("option", { value: a, selected: a === v }, a)));
        } else {
          vin = h("input", { id: `label-value-${i}`, "aria-label": `label ${i + 1} value`, value: v, list: allowed.length ? `label-values-${i}` : undefined, spellcheck: "false" });
        }
        vin.addEventListener("change", () => put(i, kin.value.trim(), vin.value, false));
        return h("div", { class: "row-item label-row", "data-path": labelPath(k), "data-key": k }, kin, "=", vin,
          allowed.length && !policy.validation ? h("datalist", { id: `label-values-${i}` }, allowed.map((a) => h("option", { value: a }))) : "",
          maintained[k] ? h("span", { class: "muted" }, allowed.length ? `one of ${allowed.join(", ")}` : "any value") : "",
          h("button", { type: "button", class: "link", "aria-label": `remove label ${k || i + 1}`, onclick: () => { delete doc.metadata.labels[k]; changed(true); } }, "Remove"));
      }),
      h("datalist", { id: "maintained-labels" }, Object.entries(maintained).map(([k, vs]) => h("option", { value: k }, vs.length ? vs.join(", ") : "any value"))),
      h("button", { type: "button", class: "add", id: "add-label", onclick: () => {
        doc.metadata.labels = doc.metadata.labels || {};
        const unused = Object.keys(maintained).find((k) => !(k in doc.metadata.labels));
        let k = unused;
        for (let n = rows.length + 1; !k || k in doc.metadata.labels; n++) k = `key${n}`;
        doc.metadata.labels[k] = "";
        changed(true);
        document.getElementById(`label-key-${rows.length}`)?.focus();
      } }, "Add label"));
  }

  function render() {
    // Rendering again replaces the inputs: keep the keyboard where it was.
    const focused = form.contains(document.activeElement) ? document.activeElement.id : "";
    const s = doc.spec;
    const ray = s.type === "RayJob";
    const clusters = Object.entries(cat.clusters).filter(([, c]) => c.region === s.placement.region).map(([k]) => k);
    const pools = Object.entries(cat.pools).filter(([, p]) => p.cluster === s.placement.cluster).map(([k]) => k);
    const specs = cat.pools[s.compute.pool]?.instanceSpecs || [];
    const specHint = (name) => {
      const x = cat.instanceSpecs[name];
      return x ? `${x.gpus ? `${x.gpus} × ${x.gpuModel} GPU, ` : ""}${x.vcpus} vCPU, ${x.memoryMib} MiB per unit` : "";
    };
    form.replaceChildren(
      h("section", { "aria-labelledby": "sec-basic" }, h("h2", { id: "sec-basic" }, "Basic information"),
        select("spec.placement.region", "Region", Object.keys(cat.regions), true),
        select("spec.placement.cluster", "Cluster", clusters, true),
        select("metadata.projectGroup", "Project group", me.role === "admin" ? Object.keys(cat.projectGroups) : me.groups, true),
        text("metadata.namePrefix", "Task name prefix", { hint: "lowercase letters, digits and hyphens; a unique suffix is added" }),
        select("spec.type", "Task type", ["PyTorchJob", "RayJob"], true),
        check1("metadata.public", "Public within the project group"),
        labelsEditor()),
      h("section", { "aria-labelledby": "sec-env" }, h("h2", { id: "sec-env" }, "Environment"),
        imagePicker(ray ? "RayJob needs an image with Ray." : ""),
        inherited.length ? h("div", { class: "inherited", id: "inherited-env" }, h("span", { class: "muted" }, "Inherited from your TaskEnv (a variable of the same name below wins): "),
          inherited.map((v) => h("span", { class: "label", "data-name": v.name }, v.hidden ? `${v.name} (hidden)` : `${v.name}=${v.value}`))) : "",
        list("spec.environment.env", "Environment variables", () => ({ name: "", value: "" }), (p) => [
          text(`${p}.name`, "Name"), text(`${p}.value`, "Value", { placeholder: getPath(doc, `${p}.hidden`) && !getPath(doc, `${p}.value`) ? "hidden: enter the value" : undefined }),
          check1(`${p}.hidden`, "Hidden (write-only)")]),
        list("spec.environment.volumes", "Volumes", () => ({ volume: inCluster(cat.volumes)[0] || "", mountPath: joinPath("/volume", inCluster(cat.volumes)[0] || "") }), volumeRow,
          noneIn("volumes", cat.volumes)),
        list("spec.environment.datasets", "Datasets", () => ({ dataset: inCluster(cat.datasets)[0] || "", mountPath: "/mnt/data" }), (p) => [
          select(`${p}.dataset`, "Dataset", inCluster(cat.datasets)), text(`${p}.mountPath`, "Mount path")], noneIn("datasets", cat.datasets)),
        list("spec.environment.models", "Models", () => ({ model: inCluster(cat.models)[0] || "", mountPath: "/mnt/model" }), (p) => [
          select(`${p}.model`, "Model", inCluster(cat.models)), text(`${p}.mountPath`, "Mount path")], noneIn("models", cat.models)),
        text("spec.environment.cmd", ray ? "Entrypoint (run with bash -c on the head)" : "cmd (run with bash -c)", { multiline: true, rows: 4, hint: ray ? "" : "MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK are set in every replica" })),
      h("section", { "aria-labelledby": "sec-compute" }, h("h2", { id: "sec-compute" }, "Compute resources"),
        select("spec.compute.resourceType", "Resource type", ["Reserved", "Ondemand", "Spot", "Idle"], true),
        select("spec.compute.pool", "Resource pool", pools, true, "", "No resource pool in this cluster; choose another cluster, or an admin adds one."),
        num("spec.compute.workers", ray ? "Workers (plus one head)" : "Workers (plus one master)", { min: 0 }),
        list("spec.compute.instanceSpecs", "Instance specs, in order of preference", () => ({ spec: specs[0] || "", countPerNode: 1 }), (p) => [
          select(`${p}.spec`, "Instance spec", specs, false, specHint(getPath(doc, `${p}.spec`)), "No instance spec in this pool; choose another pool, or an admin adds one."), num(`${p}.countPerNode`, "Count per node", { min: 1 })]),
        num("spec.compute.priority", "Priority", { min: 0, placeholder: "5" }),
        check1("spec.compute.guarantee", "Guarantee (no Spot or Idle capacity; never preempted)"),
        s.compute.resourceType === "Reserved" ? check1("spec.compute.idleSupplement", "Supplement with idle resources when quota runs short") : ""),
      h("section", { "aria-labelledby": "sec-adv" }, h("h2", { id: "sec-adv" }, "Advanced options"),
        !ray ? block("spec.advanced.precheck", "Resource precheck before the command", { timeoutSeconds: 300 }, () => [
          num("spec.advanced.precheck.timeoutSeconds", "Timeout, seconds", { min: 1 }),
          num("spec.advanced.precheck.minGemmTflops", "Minimum GEMM TFLOP/s", { step: "any" }),
          num("spec.advanced.precheck.minAllreduceGbps", "Minimum all-reduce GB/s", { step: "any" })]) : "",
        block("spec.advanced.faultTolerance", "Fault tolerance", { maxResubmissions: 3, nodeReplacement: true }, () => [
          num("spec.advanced.faultTolerance.maxResubmissions", "Maximum automatic resubmissions", { min: 0 }),
          check1("spec.advanced.faultTolerance.nodeReplacement", "Replace a failed node")]),
        !ray ? block("spec.advanced.exitCheckpoint", "Exit checkpoint notice", { timeoutSeconds: 300, signal: "SIGUSR1" }, () => [
          num("spec.advanced.exitCheckpoint.timeoutSeconds", "Wait at most, seconds (≤ 600)", { min: 1 }),
          select("spec.advanced.exitCheckpoint.signal", "Signal", ["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT"])]) : "",
        block("spec.advanced.metrics", "Custom metrics", { intervalSeconds: 15, endpoints: [{ port: 8000, path: "/metrics" }] }, () => [
          num("spec.advanced.metrics.intervalSeconds", "Scrape every, seconds", { min: 5 }),
          list("spec.advanced.metrics.endpoints", "Endpoints", () => ({ port: 8000, path: "/metrics" }), (p) => [num(`${p}.port`, "Port", { min: 1 }), text(`${p}.path`, "Path")])]),
        num("spec.advanced.imagePullTolerance", "Image pull tolerance", { min: -1, hint: "-1 never gives up, 0 fails at the first failed pull, N retries" }),
        check1("spec.advanced.passwordlessSsh", "Passwordless SSH between replicas"),
        list("spec.advanced.alarms", "Alarm subscriptions", () => ({ events: ["failed"], webhook: "http://" }), (p) => [
          text(`${p}.webhook`, "Webhook URL"),
          text(`${p}.events`, "Events (comma-separated)", { hint: "failed, succeeded, stopped, preempted, resubmitted, nodeReplaced, precheckFailed, queuedTooLong" }),
          num(`${p}.queuedThresholdSeconds`, "Queued longer than, seconds")])),
      !ray
        ? h("section", { "aria-labelledby": "sec-type" }, h("h2", { id: "sec-type" }, "PyTorchJob"),
          num("spec.pytorch.procsPerNode", "Processes per replica (torchrun --nproc_per_node)", { min: 1, placeholder: "one per GPU" }))
        : h("section", { "aria-labelledby": "sec-type" }, h("h2", { id: "sec-type" }, "RayJob"),
          select("spec.ray.head.instanceSpec.spec", "Head instance spec", specs, false, "", "No instance spec in this pool; choose another pool, or an admin adds one."),
          text("spec.ray.runtimeEnvYaml", "Runtime env (YAML)", { multiline: true, rows: 4, optional: true }),
          block("spec.ray.sharedStorage", "Shared storage at /tmp/ray", { volume: Object.entries(cat.volumes || {}).find(([, v]) => v.multiPodReadWrite)?.[0] || "", cleanupOnExit: false }, () => [
            select("spec.ray.sharedStorage.volume", "Volume (multi-pod read-write)", Object.entries(cat.volumes || {}).filter(([, v]) => v.multiPodReadWrite).map(([k]) => k), false, "",
              "No multi-pod read-write volume in the catalog; an admin adds one."),
            check1("spec.ray.sharedStorage.cleanupOnExit", "Clean up this task's data when it ends")]),
          block("spec.ray.debug", "Debug mode (keep the cluster after the job)", { retentionSeconds: 600 }, () => [num("spec.ray.debug.retentionSeconds", "Keep for, seconds", { min: 1 })]),
          block("spec.ray.autoscaling", "Autoscaling", { minWorkers: 0, maxWorkers: Math.max(1, s.compute.workers || 1), idleTimeoutSeconds: 60, mode: "Default" }, () => [
            num("spec.ray.autoscaling.minWorkers", "Minimum workers", { min: 0 }), num("spec.ray.autoscaling.maxWorkers", "Maximum workers", { min: 1 }),
            num("spec.ray.autoscaling.idleTimeoutSeconds", "Idle timeout, seconds", { min: 1 }),
            select("spec.ray.autoscaling.mode", "Mode", ["Default", "Aggressive", "Conservative"])])),
      h("div", { class: "row" },
        h("button", { type: "button", id: "as-yaml", onclick: async () => {
          const { data } = await api("POST", "/api/v1/validate", JSON.stringify(toDoc()));
          sessionStorage.setItem("trainyard.clone", data.yaml || JSON.stringify(toDoc(), null, 2));
          location.hash = "#/new";
        } }, "Edit as YAML"),
        h("button", { type: "submit", id: "create-submit" }, "Create")),
    );
    if (ray && !s.ray) s.ray = {};
    if (!ray) delete s.ray;
    if (ray) delete s.pytorch;
    if (focused) document.getElementById(focused)?.focus();
  }

  // The alarm events field is edited as text; the document wants a list.
  function toDoc() {
    const d = JSON.parse(JSON.stringify(doc));
    for (const a of d.spec.advanced?.alarms || []) if (typeof a.events === "string") a.events = a.events.split(",").map((e) => e.trim()).filter(Boolean);
    if (d.spec.ray?.head && !d.spec.ray.head.instanceSpec?.spec) delete d.spec.ray.head;
    // What the form does not show is not sent (it stays in the form: switching back shows it again).
    if (d.spec.type === "RayJob" && d.spec.advanced) { delete d.spec.advanced.precheck; delete d.spec.advanced.exitCheckpoint; }
    if (d.spec.compute && d.spec.compute.resourceType !== "Reserved") delete d.spec.compute.idleSupplement;
    return d;
  }

  async function check() {
    let data;
    try {
      ({ data } = await api("POST", "/api/v1/validate", JSON.stringify(toDoc())));
    } catch (e) {
      summary.replaceChildren(fail(e));
      return;
    }
    for (const old of form.querySelectorAll(".field-problem")) old.remove();
    const shown = [];
    for (const p of data.problems) {
      let path = dotted(p.path);
      let at = null;
      while (path && !(at = form.querySelector(`[data-path="${CSS.escape(path)}"]`))) path = path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "";
      const around = [];
      for (let e = at; e; e = e.parentElement?.closest("[data-path]")) around.push(e.dataset.path);
      if (!attempted && !touched.has(dotted(p.path)) && !around.some((x) => touched.has(x))) continue;
      shown.push(p);
      (at || form).append(h("div", { class: `field-problem ${p.severity}`, role: "alert", "data-for": p.path }, p.message));
    }
    const pending = data.problems.length - shown.length;
    problems.replaceChildren(...shown.map((p) => h("li", { class: p.severity, "data-path": p.path }, h("code", {}, p.path || "(document)"), ` ${p.message}`)),
      pending ? h("li", { class: "muted", id: "problems-pending" }, `${pending} problem${pending === 1 ? "" : "s"} left; each shows at its field once you edit it or press Create.`) : "");
    const c = doc.spec.compute;
    const lines = (quota || []).filter((q) => q.group === doc.metadata.projectGroup && q.pool === c.pool && q.resourceType === c.resourceType && (c.instanceSpecs || []).some((s) => s.spec === q.spec));
    summary.replaceChildren(
      h("h2", {}, "Demand and quota"),
      ...(data.demand || []).map((d) => h("p", { class: "demand" }, h("strong", {}, `Option ${d.option + 1}: `),
        d.roles.map((r) => `${r.role} ${r.replicas} × ${r.spec} (${r.countPerNode} per replica)`).join("; "),
        ` — ${d.replicas} replica${d.replicas === 1 ? "" : "s"}, ${d.total.gpus} GPUs, ${d.total.vcpus} vCPU, ${d.total.memoryMib} MiB`)),
      lines.length ? h("table", { class: "quota", id: "quota" }, h("thead", {}, h("tr", {}, ["Spec", "Quota", "Remaining", "Pool available", "Idle", "Unreserved"].map((x) => h("th", { scope: "col" }, x)))),
        h("tbody", {}, lines.map((q) => h("tr", {}, h("td", {}, q.spec), h("td", {}, q.limit), h("td", {}, q.remaining), h("td", {}, q.poolAvailable), h("td", {}, q.idle), h("td", {}, q.unreserved))))) : h("p", { class: "muted" }, "No quota lines for this group, pool, resource type and specs."),
      ...(data.fragmentation || []).map((f) => h("p", { class: "muted fragmentation" }, `${f.spec}: ${f.replicasFit} replicas of this size fit now on ${f.nodesWithRoom} nodes; free blocks `,
        Object.entries(f.freeUnits).map(([units, nodes]) => `${units} unit${units === "1" ? "" : "s"} × ${nodes} node${nodes === 1 ? "" : "s"}`).join(", ") || "none")),
      data.admission ? h("p", { id: "admission", class: data.admission.now ? "ok" : "warn" }, data.admission.now ? "✓ " : "⏳ ", data.admission.reason) : h("p", { class: "muted" }, "Fix the problems to see whether it would be admitted."),
    );
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = document.getElementById("create-submit");
    attempted = true;
    button.disabled = true;
    try {
      const { data } = await api("POST", "/api/v1/tasks", JSON.stringify(toDoc()), { "Idempotency-Key": key, "Content-Type": "application/json" });
      location.hash = `#/tasks/${data.id}`;
    } catch (e) {
      problems.replaceChildren(fail(e));
      check();
    } finally {
      button.disabled = false;
    }
  });
  render();
  show(h("h1", {}, "Create Training"), cloneNote ? h("p", { id: "clone-note", class: "card" }, cloneNote) : "", h("div", { class: "create" }, form, h("aside", {}, summary, h("h2", {}, "Problems"), problems)));
  check();
}

// ---- admin -----------------------------------------------------------------------------------------------

async function adminPage() {
  const msg = h("p", { role: "status", "aria-live": "polite", id: "admin-msg" });
  const say = (text, bad) => { msg.textContent = text; msg.className = bad ? "error" : "ok"; };
  const nodes = h("tbody", { id: "nodes" });
  const quota = h("tbody", { id: "quota-lines" });
  const catalogText = h("textarea", { id: "catalog", rows: 18, spellcheck: "false", "aria-label": "catalog (JSON or YAML)" });
  const labelSwitch = h("input", { type: "checkbox", id: "label-validation" });
  const users = h("tbody", { id: "users" });
  const owners = h("tbody", { id: "catalog-groups" });
  const cached = h("tbody", { id: "cached-images" });
  const cacheTotal = h("span", { id: "cache-total", class: "muted" });
  const logins = h("tbody", { id: "registry-logins" });
  const login = { host: h("input", { id: "login-host", "aria-label": "registry host", placeholder: "registry.example:5000", spellcheck: "false" }),
    username: h("input", { id: "login-user", "aria-label": "registry user name", spellcheck: "false" }),
    password: h("input", { id: "login-password", type: "password", "aria-label": "registry password", autocomplete: "new-password" }) };
  const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
  async function loadImages() {
    try {
      const { data } = await api("GET", "/api/v1/admin/images");
      cached.replaceChildren(...data.items.map((x) => h("tr", { "data-digest": x.digest },
        h("td", { class: "mono", title: x.digest }, x.digest.slice(0, 19)), h("td", { class: "mono" }, x.references.join(", ")),
        h("td", {}, mib(x.bytes)), h("td", {}, new Date(x.lastUsedMs).toLocaleString()))));
      if (!data.items.length) cached.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No registry images are cached on this machine.")));
      cacheTotal.textContent = `${data.items.length} image${data.items.length === 1 ? "" : "s"}, ${mib(data.items.reduce((a, x) => a + x.bytes, 0))}`;
      const l = await api("GET", "/api/v1/admin/registries");
      logins.replaceChildren(...l.data.items.map((x) => h("tr", { "data-host": x.host },
        h("td", { class: "mono" }, x.host), h("td", {}, x.username), h("td", {}, new Date(x.updatedAtMs).toLocaleString()),
        h("td", {}, h("button", { type: "button", class: "link", "aria-label": `remove the login of ${x.host}`, onclick: async () => {
          if (!confirm(`Remove the login of ${x.host}?`)) return;
          try { await api("DELETE", `/api/v1/admin/registries/${encodeURIComponent(x.host)}/login`); say(`login of ${x.host} removed`); loadImages(); } catch (e) { say(e.message, true); }
        } }, "Remove")))));
    } catch (e) { say(e.message, true); }
  }
  const groups = h("tbody", { id: "project-groups" });
  let cat = null;

  // Users (name, role, groups) and the project groups with their members, from the same list.
  async function loadUsers() {
    const { data } = await api("GET", "/api/v1/admin/users");
    // Disabling refuses every token of the user (within seconds on every server); their tasks stay.
    const setDisabled = (u, off) => async () => {
      if (off && !confirm(`Disable ${u.name}? Every token of theirs is refused until enabled again.`)) return;
      try {
        await api("POST", `/api/v1/admin/users/${encodeURIComponent(u.name)}/${off ? "disable" : "enable"}`);
        say(`user ${u.name} ${off ? "disabled" : "enabled"}`);
        await loadUsers();
      } catch (e) { say(e.message, true); }
    };
    users.replaceChildren(...data.items.map((u) => h("tr", { "data-user": u.name, "data-disabled": String(!!u.disabled) },
      h("td", {}, u.name), h("td", {}, u.role), h("td", {}, u.groups.join(", ") || h("span", { class: "muted" }, "none")),
      h("td", {}, h("span", { class: `badge ${u.disabled ? "failed" : "succeeded"}` }, u.disabled ? "disabled" : "active")),
      h("td", {}, h("button", { type: "button", class: "link", "aria-label": `edit ${u.name}`, onclick: () => {
        user.name.value = u.name; user.role.value = u.role; user.groups.value = u.groups.join(", "); user.name.focus();
      } }, "Edit"), " ",
      h("button", { type: "button", class: "link", "aria-label": `tokens of ${u.name}`, onclick: () => loadTokens(u.name) }, "Tokens"), " ",
      u.disabled
        ? h("button", { type: "button", "data-action": "enable", "aria-label": `enable ${u.name}`, onclick: setDisabled(u, false) }, "Enable")
        : h("button", { type: "button", class: "danger", "data-action": "disable", "aria-label": `disable ${u.name}`, onclick: setDisabled(u, true) }, "Disable")))));
    const names = [...new Set([...Object.keys(cat?.projectGroups || {}), ...data.items.flatMap((u) => u.groups)])].sort();
    groups.replaceChildren(...names.map((g) => {
      const members = data.items.filter((u) => u.groups.includes(g)).map((u) => u.name);
      const known = g in (cat?.projectGroups || {});
      const lines = (q?.items || []).filter((l) => l.group === g);
      return h("tr", { "data-group": g },
        h("td", {}, g, known ? "" : h("span", { class: "muted" }, " (not in the catalog)")),
        h("td", { class: "members" }, members.join(", ") || h("span", { class: "muted" }, "no members")),
        h("td", {}, lines.length ? lines.map((l) => h("span", { class: "label" }, `${l.resourceType} ${l.spec}: ${l.limit - l.remaining}/${l.limit}`)) : h("span", { class: "muted" }, "no quota")));
    }));
  }
  let q = null;

  // A user's tokens by id (never the token itself), each with Revoke.
  const tokensTitle = h("h3", { id: "tokens-title" });
  const tokenRows = h("tbody", { id: "tokens" });
  async function loadTokens(name) {
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(name)}/tokens`);
      tokensTitle.textContent = `Tokens of ${name}`;
      tokenRows.replaceChildren(...data.items.map((t) => h("tr", { "data-token": t.id },
        h("td", { class: "mono" }, t.id), h("td", {}, t.label || h("span", { class: "muted" }, "no label")),
        h("td", {}, new Date(t.createdAtMs).toLocaleString()),
        h("td", {}, h("button", { type: "button", class: "danger", "aria-label": `revoke token ${t.id}`, onclick: async () => {
          if (!confirm(`Revoke token ${t.id} of ${name}?`)) return;
          try {
            await api("DELETE", `/api/v1/users/${encodeURIComponent(name)}/tokens/${encodeURIComponent(t.id)}`);
            say(`token ${t.id} of ${name} revoked`);
            await loadTokens(name);
          } catch (e) { say(e.message, true); }
        } }, "Revoke")))));
    } catch (e) { say(e.message, true); }
  }

  async function load() {
    ({ data: cat } = await api("GET", "/api/v1/catalog"));
    ({ data: q } = await api("GET", "/api/v1/quota"));
    catalogText.value = JSON.stringify(cat, null, 2);
    labelSwitch.checked = !!cat.labels?.validation;
    nodes.replaceChildren(...Object.entries(cat.nodes).map(([name, n]) => {
      const state = n.failed ? "failed" : n.schedulable === false ? "cordoned" : "healthy";
      const put = (body, what) => async () => {
        if (!confirm(`${what} node ${name}?`)) return;
        try {
          await api("PUT", `/api/v1/admin/nodes/${encodeURIComponent(name)}`, JSON.stringify(body), { "Content-Type": "application/json" });
          say(`node ${name}: ${what.toLowerCase()} done`);
          load();
        } catch (e) { say(e.message, true); }
      };
      return h("tr", { "data-node": name },
        h("td", {}, name), h("td", {}, n.pool), h("td", {}, `${n.gpus ? `${n.gpus} × ${n.gpuModel}, ` : ""}${n.vcpus} vCPU, ${n.memoryMib} MiB`),
        h("td", {}, h("span", { class: `badge ${state === "healthy" ? "succeeded" : state === "failed" ? "failed" : "queued"}`, "data-state": state }, state)),
        h("td", {},
          n.schedulable === false ? h("button", { type: "button", onclick: put({ schedulable: true }, "Uncordon") }, "Uncordon") : h("button", { type: "button", onclick: put({ schedulable: false }, "Cordon") }, "Cordon"), " ",
          n.failed ? h("button", { type: "button", onclick: put({ failed: false }, "Repair") }, "Repair") : h("button", { type: "button", class: "danger", "data-action": "fail", onclick: put({ failed: true }, "Mark failed") }, "Mark failed")));
    }));
    // Which project groups may use each image, volume, dataset and model (catalog `projectGroups`).
    const kinds = [["image", cat.images], ["volume", cat.volumes], ["dataset", cat.datasets], ["model", cat.models]];
    owners.replaceChildren(...kinds.flatMap(([kind, m]) => Object.entries(m || {}).map(([name, x]) => {
      const groups = x.projectGroups || [];
      const who = kind === "image" && name === "host"
        ? `admins${groups.length ? `, and ${groups.join(", ")}` : " only"}`
        : groups.length ? groups.join(", ") : "every group";
      return h("tr", { "data-entry": `${kind}/${name}` }, h("td", {}, kind), h("td", { class: "mono" }, name), h("td", {}, who));
    })));
    quota.replaceChildren(...q.items.map((l) => h("tr", {}, [l.group, l.resourceType, l.pool, l.spec, l.limit, l.limit - l.remaining, l.remaining, l.poolAvailable, l.idle].map((v) => h("td", {}, v)))));
    await loadUsers();
    await loadImages();
  }

  async function saveCatalog(text) {
    try {
      await api("PUT", "/api/v1/admin/catalog", text);
      say("catalog saved");
      load();
    } catch (e) { say(e.message, true); }
  }
  labelSwitch.addEventListener("change", () => {
    const c = JSON.parse(JSON.stringify(cat));
    c.labels = { ...(c.labels || {}), validation: labelSwitch.checked };
    saveCatalog(JSON.stringify(c));
  });

  const user = { name: h("input", { id: "user-name", "aria-label": "user name" }), role: h("select", { id: "user-role", "aria-label": "role" }, h("option", {}, "member"), h("option", {}, "admin")), groups: h("input", { id: "user-groups", "aria-label": "project groups", placeholder: "group-a, group-b" }) };
  const tokenOut = h("pre", { id: "new-token" });
  const envUser = h("input", { id: "env-user", "aria-label": "user", placeholder: "user" });
  const envRows = h("tbody", {});
  const envNew = { name: h("input", { "aria-label": "variable name", placeholder: "NAME" }), value: h("input", { "aria-label": "value", placeholder: "value" }), hidden: h("input", { type: "checkbox", "aria-label": "hidden" }) };
  async function loadEnv() {
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`);
      envRows.replaceChildren(...(data.items || []).map((v) => h("tr", {}, h("td", { class: "mono" }, v.name), h("td", {}, v.hidden ? "(hidden)" : v.value),
        h("td", {}, h("button", { type: "button", class: "link", onclick: async () => { await api("DELETE", `/api/v1/users/${encodeURIComponent(envUser.value)}/env/${encodeURIComponent(v.name)}`); loadEnv(); } }, "Remove")))));
    } catch (e) { say(e.message, true); }
  }

  show(
    h("h1", {}, "Admin"), msg,
    h("section", {}, h("h2", {}, "Nodes"), h("table", {}, h("thead", {}, h("tr", {}, ["Node", "Pool", "Capacity", "Health", "Actions"].map((c) => h("th", { scope: "col" }, c)))), nodes)),
    h("section", {}, h("h2", {}, "Quotas and usage"), h("table", {}, h("thead", {}, h("tr", {}, ["Group", "Type", "Pool", "Spec", "Quota", "Used", "Remaining", "Pool available", "Idle"].map((c) => h("th", { scope: "col" }, c)))), quota)),
    h("section", {}, h("h2", {}, "Labels"), h("div", { class: "field check" }, labelSwitch, h("label", { for: "label-validation" }, "Tasks must use maintained labels")),
      h("p", { class: "muted" }, "Maintained labels are in the catalog below, under labels.maintained.")),
    h("section", {}, h("h2", { id: "owners-title" }, "Who may use what"),
      h("table", { "aria-labelledby": "owners-title" }, h("thead", {}, h("tr", {}, ["Kind", "Name", "Project groups"].map((c) => h("th", { scope: "col" }, c)))), owners),
      h("p", { class: "muted" }, "Set projectGroups on an image, volume, dataset or model in the catalog below; without it every group may use it (the host image: admins only).")),
    h("section", {}, h("h2", { id: "images-title" }, "Image cache"),
      h("table", { "aria-labelledby": "images-title" }, h("thead", {}, h("tr", {}, ["Digest", "References", "Size", "Last used"].map((c) => h("th", { scope: "col" }, c)))), cached),
      h("div", { class: "row" }, cacheTotal,
        h("button", { type: "button", id: "prune-images", class: "danger", onclick: async () => {
          if (!confirm("Remove every cached image that no task runs?")) return;
          try {
            const { data } = await api("POST", "/api/v1/admin/images/prune");
            say(`pruned ${data.removed.length} image${data.removed.length === 1 ? "" : "s"}, ${mib(data.freedBytes)} freed`);
            loadImages();
          } catch (e) { say(e.message, true); }
        } }, "Prune unused images")),
      h("h3", { id: "logins-title" }, "Registry logins"),
      h("table", { "aria-labelledby": "logins-title" }, h("thead", {}, h("tr", {}, ["Registry", "User", "Set", ""].map((c) => h("th", { scope: "col" }, c)))), logins),
      h("div", { class: "row-item" }, login.host, login.username, login.password,
        h("button", { type: "button", id: "set-login", onclick: async () => {
          try {
            await api("PUT", `/api/v1/admin/registries/${encodeURIComponent(login.host.value.trim())}/login`,
              JSON.stringify({ username: login.username.value, password: login.password.value }), { "Content-Type": "application/json" });
            say(`login of ${login.host.value.trim()} set`);
            login.password.value = "";
            loadImages();
          } catch (e) { say(e.message, true); }
        } }, "Set login")),
      h("p", { class: "muted" }, "Passwords are stored sealed and never shown again; tasks pulling from the registry (or its mirrors) use the login.")),
    h("section", {}, h("h2", {}, "Catalog"), catalogText, h("div", { class: "row" }, h("span", { class: "muted" }, "Regions, clusters, pools, nodes, instance specs, quotas, images, volumes, datasets, models, labels."),
      h("button", { type: "button", id: "save-catalog", onclick: () => { if (confirm("Replace the catalog?")) saveCatalog(catalogText.value); } }, "Save catalog"))),
    h("section", {}, h("h2", { id: "users-title" }, "Users and tokens"),
      h("table", { "aria-labelledby": "users-title" }, h("thead", {}, h("tr", {}, ["User", "Role", "Project groups", "State", ""].map((c) => h("th", { scope: "col" }, c)))), users),
      h("h3", {}, "Add or change a user"),
      h("div", { class: "row-item" }, h("label", {}, "Name ", user.name), h("label", {}, "Role ", user.role), h("label", {}, "Project groups ", user.groups),
        h("button", { type: "button", id: "save-user", onclick: async () => {
          try {
            const groups = user.groups.value.split(",").map((g) => g.trim()).filter(Boolean);
            await api("POST", "/api/v1/admin/users", JSON.stringify({ name: user.name.value, role: user.role.value, groups }), { "Content-Type": "application/json" });
            say(`user ${user.name.value} saved`);
            await loadUsers();
          } catch (e) { say(e.message, true); }
        } }, "Save user"),
        h("button", { type: "button", id: "new-token-for-user", onclick: async () => {
          try {
            const { data } = await api("POST", `/api/v1/users/${encodeURIComponent(user.name.value)}/tokens`, JSON.stringify({ label: "console" }), { "Content-Type": "application/json" });
            tokenOut.textContent = `token for ${user.name.value} (shown once): ${data.token}`;
          } catch (e) { say(e.message, true); }
        } }, "New token")),
      tokenOut, tokensTitle, h("table", { "aria-labelledby": "tokens-title" }, tokenRows)),
    h("section", {}, h("h2", { id: "groups-title" }, "Project groups"),
      h("table", { "aria-labelledby": "groups-title" }, h("thead", {}, h("tr", {}, ["Group", "Members", "Quota"].map((c) => h("th", { scope: "col" }, c)))), groups),
      h("p", { class: "muted" }, "Groups are in the catalog (projectGroups); a user's groups are set above.")),
    h("section", {}, h("h2", {}, "TaskEnv"), h("div", { class: "row-item" }, envUser, h("button", { type: "button", onclick: loadEnv }, "Show")),
      h("table", {}, h("tbody", {}, envRows)),
      h("div", { class: "row-item" }, envNew.name, envNew.value, h("label", {}, envNew.hidden, " hidden"),
        h("button", { type: "button", onclick: async () => {
          try {
            await api("PUT", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`, JSON.stringify({ name: envNew.name.value, value: envNew.value.value, hidden: envNew.hidden.checked }), { "Content-Type": "application/json" });
            loadEnv();
          } catch (e) { say(e.message, true); }
        } }, "Set"))),
  );
  await load();
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
  if (path === "/create") return createPage(new URLSearchParams(query || ""));
  if (path === "/admin") return adminPage();
  return taskList(new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);
route();
