// One task: overview, attempts, replicas, events, logs (followed live), metrics and its spec, with the actions
// a user may take on it.

import { api, badge, fail, h, repeat, show, stopRepeating, TERMINAL, token, when } from "./core.js";

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

export async function taskPage(id) {
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
      if (!running) stopRepeating();
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
  repeat(refresh, 2000);
}
