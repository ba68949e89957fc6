// @ts-check
// One task: overview, attempts, replicas, events, logs (followed live, searchable), metrics as charts and its
// spec as YAML or JSON, with the actions a user may take on it.

import { ago, api, badge, duration, fail, h, moment, repeat, show, TERMINAL, token } from "./core.js";
import { lineChart, metricOrder, seriesName } from "./charts.js";
import { logView } from "./task-log.js";
import { toYaml } from "./yaml.js";

const SPEC_FORMAT_KEY = "trainyard.specFormat";
/// The most metrics drawn as charts; the rest are named (a task may expose as many as it likes).
const MAX_CHARTS = 24;
const ACTIVE = ["Admitted", "Starting", "Prechecking", "Running", "Stopping"];

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

/// The spec as YAML (as it would be written) or as JSON, with a Copy button.
function specView() {
  const pre = h("pre", { class: "spec", id: "spec", tabindex: "0", "aria-label": "spec" });
  const copied = h("span", { id: "spec-copied", class: "muted", "aria-live": "polite" });
  let format = localStorage.getItem(SPEC_FORMAT_KEY) === "json" ? "json" : "yaml";
  let value = null;
  const toggle = (f, label) => h("button", { type: "button", id: `spec-${f}`, class: "segment", "aria-pressed": String(format === f), onclick: () => {
    format = f;
    localStorage.setItem(SPEC_FORMAT_KEY, f);
    for (const b of bar.querySelectorAll(".segment")) b.setAttribute("aria-pressed", String(b.id === `spec-${f}`));
    draw();
  } }, label);
  const text = () => (format === "json" ? `${JSON.stringify(value, null, 2)}\n` : toYaml(value));
  function draw() {
    pre.dataset.format = format;
    pre.textContent = value === null ? "" : text();
  }
  const copy = h("button", { type: "button", id: "spec-copy", class: "secondary", onclick: async () => {
    try {
      await navigator.clipboard.writeText(text());
      copied.textContent = `Copied as ${format.toUpperCase()}.`;
    } catch {
      // No clipboard (a page served over plain HTTP from another machine): the text is selected instead.
      const r = document.createRange();
      r.selectNodeContents(pre);
      getSelection().removeAllRanges();
      getSelection().addRange(r);
      copied.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
    }
  } }, "Copy");
  const bar = h("div", { class: "spec-bar" }, h("div", { class: "segments", role: "group", "aria-label": "Format" }, toggle("yaml", "YAML"), toggle("json", "JSON")), copy, copied);
  return {
    bar, pre,
    set(v) {
      if (JSON.stringify(v) === JSON.stringify(value)) return;
      value = v;
      draw();
    },
  };
}

/**
 * What holds the room a queued task waits for: the running tasks you may see (those on its group's quota
 * first), each a link, with its units and how long it has run, and how many more you may not see. Tasks have
 * no time limit, so when they free is not said.
 * @param {any} q the task's `queue`
 * @param {number} now
 * @param {(k: string, v: any, key?: string) => HTMLElement[]} dd
 */
function holdersOf(q, now, dd) {
  const list = q.holders || [];
  if (!list.length && !q.moreHolders) return [];
  const items = list.map((/** @type {any} */ x) => h("li", {},
    h("a", { href: `#/tasks/${encodeURIComponent(x.name)}` }, x.name),
    ` (${x.owner}, ${x.projectGroup}): ${x.units} units of ${x.spec}, running ${duration(now - x.runningSinceMs)}`,
    x.spendsItsQuota ? ", on the same quota" : "", x.stopping ? ", stopping" : ""));
  if (q.moreHolders) items.push(h("li", { class: "muted" }, `${q.moreHolders} more you may not see`));
  return dd("Held by", h("ul", { class: "holders" }, ...items), "holders");
}

export async function taskPage(id) {
  const head = h("div", { class: "task-head" });
  const overview = h("dl", { class: "overview" });
  const actions = h("div", { class: "actions task-actions" });
  const replicas = h("tbody", {});
  const attempts = h("tbody", { id: "attempts" });
  const events = h("ol", { class: "events", id: "events" });
  const spec = specView();
  const charts = h("div", { class: "charts", id: "metrics" });
  const chartNote = h("p", { class: "muted", id: "metrics-note" });
  const byMetric = new Map();
  const logSelect = h("select", { id: "log-replica", "aria-label": "replica" });
  const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  const logs = logView();
  const download = h("a", { href: "#", id: "log-download" }, "Download");
  let task = null;
  let logAbort = null;
  let timer = "";

  async function act(what, method, path, confirmText) {
    if (!confirm(confirmText)) return;
    try {
      const { data } = await api(method, path);
      if (what === "clone") location.hash = `#/tasks/${encodeURIComponent(data.name)}`;
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
    logs.clear();
    const base = `/api/v1/tasks/${id}/logs?replica=${encodeURIComponent(replica)}&attempt=${attempt}`;
    if (!follow.checked) {
      const { data } = await api("GET", base);
      logs.add(data.replace(/\n$/, "").split("\n").filter((l, i, all) => l || all.length > 1));
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
        const more = [];
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (ev.startsWith("event: end")) continue;
          const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (ev.split("\n").some((l) => l.startsWith("data:"))) more.push(data);
        }
        logs.add(more);
      }
    } catch (e) {
      if (e.name !== "AbortError") logs.note(e.message);
    }
  }

  /** Why a task has no log yet, from where it stands. */
  function waitingText() {
    if (!task) return "Waiting to start.";
    if (task.queue) return `Waiting to start: queued #${task.queue.position} (${task.queue.positionInGroup} in its group): ${task.queue.reason}`;
    if (task.starting) return `Waiting to start: ${task.starting.reason}`;
    if (["Succeeded", "Failed", "Stopped"].includes(task.status)) return "No replica of this task ran, so there is no log.";
    return `Waiting to start (${task.status.toLowerCase()}).`;
  }

  async function loadLogs() {
    try {
      const { data } = await api("GET", `/api/v1/tasks/${id}/logs`);
      const current = logSelect.value;
      const options = data.items.flatMap((a) => a.replicas.map((r) => h("option", { value: `${a.attempt}/${r.name}` }, `attempt ${a.attempt} · ${r.name} (${r.role})`)));
      logs.waiting(options.length ? null : waitingText());
      if (options.length !== logSelect.options.length) {
        logSelect.replaceChildren(...options);
        if (current && [...logSelect.options].some((o) => o.value === current)) logSelect.value = current;
        else if (!current && options.length) followLog();
      }
    } catch (e) { /* logs appear once replicas exist */ }
  }

  async function loadMetrics() {
    let data;
    try {
      ({ data } = await api("GET", `/api/v1/tasks/${id}/metrics`));
    } catch (e) {
      chartNote.replaceChildren(fail(e));
      return;
    }
    // One chart per metric, one line per replica and label set; replica names without the task's name.
    const groups = new Map();
    for (const s of data.series) {
      if (!groups.has(s.name)) groups.set(s.name, []);
      groups.get(s.name).push({ label: seriesName(s, task?.name), points: s.points });
    }
    const names = [...groups.keys()].sort(metricOrder);
    const drawn = names.slice(0, MAX_CHARTS);
    // One time span for every chart, so a moment is at the same place in each.
    let span = null;
    for (const s of data.series) {
      if (!s.points.length) continue;
      const [a, b] = [s.points[0][0], s.points[s.points.length - 1][0]];
      span = span ? [Math.min(span[0], a), Math.max(span[1], b)] : [a, b];
    }
    for (const [n, c] of byMetric) if (!drawn.includes(n)) { c.el.remove(); byMetric.delete(n); }
    drawn.forEach((n, i) => {
      if (!byMetric.has(n)) byMetric.set(n, lineChart(n));
      const c = byMetric.get(n);
      if (charts.children[i] !== c.el) charts.insertBefore(c.el, charts.children[i] || null);
      c.update(groups.get(n), span);
    });
    if (!names.length) {
      chartNote.textContent = `No metrics of attempt ${data.attempt} yet. The preset ones (CPU, memory, GPU) are sampled while replicas run on the local backend; a task's own need spec.advanced.metrics, an endpoint in the Prometheus text format.`;
    } else if (names.length > MAX_CHARTS) {
      chartNote.textContent = `Attempt ${data.attempt}. ${names.length - MAX_CHARTS} more metrics not drawn: ${names.slice(MAX_CHARTS).join(", ")}.`;
    } else {
      chartNote.textContent = `Attempt ${data.attempt}, ${names.length} ${names.length === 1 ? "metric" : "metrics"}. Point at a chart, or focus it and use the arrow keys, to read its values.`;
    }
  }

  // Relative times age while nobody reloads: their text follows the clock, their exact time stays in the title.
  function retick() {
    for (const t of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("#main time[datetime]"))) {
      const ms = Date.parse(t.getAttribute("datetime"));
      if (t.closest(".chart-readout")) continue;
      t.textContent = ago(ms);
      t.setAttribute("aria-label", `${ago(ms)} (${t.title})`);
    }
  }

  async function refresh() {
    try {
      const [{ data: t }, { data: ev }] = await Promise.all([api("GET", `/api/v1/tasks/${id}`), api("GET", `/api/v1/tasks/${id}/events`)]);
      task = t;
      const now = Date.now();
      // A deleted task is still read by id (one deleted while it ran is followed to its end): said so, and
      // not offered to resubmit or delete again.
      const deleted = t.deleted ? [" ", h("span", { class: "badge deleted", "data-status": "deleted" }, "deleted")] : "";
      head.replaceChildren(h("h1", {}, t.name, " ", badge(t.status), deleted), h("div", { class: "muted mono" }, t.id));
      const all = attemptsOf(t, ev.items);
      /** @type {Partial<ReturnType<typeof attemptsOf>[number]>} */
      const cur = all.find((a) => a.current) || {};
      const dd = (k, v, key) => [h("dt", {}, k), h("dd", key ? { "data-key": key } : {}, v)];
      // How long the current attempt waited and ran: so far while it does, in all once it ended.
      const times = [];
      if (t.status === "Queued" && cur.queuedAt) times.push(...dd("Queued for", duration(now - cur.queuedAt), "queued-for"));
      else if (cur.queuedAt && cur.admittedAt) times.push(...dd("Waited", duration(cur.admittedAt - cur.queuedAt), "waited"));
      if (cur.runningAt && ACTIVE.includes(t.status)) times.push(...dd("Running for", duration(now - cur.runningAt), "running-for"));
      else if (cur.runningAt && cur.endedAt) times.push(...dd("Ran for", duration(cur.endedAt - cur.runningAt), "ran-for"));
      overview.replaceChildren(
        ...dd("Type", t.type), ...dd("Owner", t.owner), ...dd("Project group", t.projectGroup),
        ...dd("Attempt", `${t.attempt} (${t.retries} automatic resubmissions)`),
        ...dd("Created", moment(t.createdAtMs), "created"), ...dd("Updated", moment(t.updatedAtMs), "updated"),
        ...times,
        ...dd("Queue", t.queue ? `#${t.queue.position} (${t.queue.positionInGroup} in its group): ${t.queue.reason}` : "—"),
        ...(t.queue ? holdersOf(t.queue, now, dd) : []),
        ...(t.starting ? dd("Waiting", `${t.starting.reason} (since ${moment(t.starting.sinceMs)})`, "starting") : []),
        ...(t.spec?.spec?.environment?.workdir ? dd("Working directory", `${t.spec.spec.environment.workdir.slice(0, 12)}, at /workspace`, "workdir") : []),
        ...dd("Resources", t.placement?.units ? t.placement.units.map(([s, c, u]) => `${u} ${c} units of ${s}`).join(", ") : "—"),
      );
      replicas.replaceChildren(...(t.placement?.replicas || []).map((r) => h("tr", {}, h("td", {}, `${r.role}-${r.index}`), h("td", {}, r.rank), h("td", {}, r.node), h("td", {}, `${r.resources.vcpus} vCPU, ${r.resources.memoryMib} MiB, ${r.resources.gpus} GPU`))));
      const soFar = (ms) => h("span", {}, duration(ms), h("span", { class: "muted" }, " so far"));
      attempts.replaceChildren(...all.reverse().map((a) => {
        const ended = a.endedAt || null;
        /** @type {string | HTMLElement} */
        let waited = "—";
        if (a.queuedAt && a.admittedAt) waited = duration(a.admittedAt - a.queuedAt);
        else if (a.queuedAt && !ended) waited = soFar(now - a.queuedAt);
        else if (a.queuedAt && ended) waited = duration(ended - a.queuedAt);
        /** @type {string | HTMLElement} */
        let ran = "—";
        if (a.runningAt) ran = ended ? duration(ended - a.runningAt) : soFar(now - a.runningAt);
        return h("tr", { "data-attempt": a.n, class: a.current ? "current" : "" },
          // Each cell names its column for the phone layout, where rows are cards.
          h("td", { "data-label": "Attempt" }, String(a.n), a.current ? h("span", { class: "muted" }, " (current)") : ""),
          h("td", { "data-label": "Queued" }, moment(a.queuedAt)),
          h("td", { "data-label": "Started" }, a.admittedAt ? moment(a.admittedAt) : "—", a.runningAt ? h("div", { class: "muted" }, "running ", moment(a.runningAt)) : ""),
          h("td", { "data-label": "Ended" }, a.endedAt ? moment(a.endedAt) : "—"),
          h("td", { class: "wait", "data-label": "Waited" }, waited),
          h("td", { class: "ran", "data-label": "Ran" }, ran),
          h("td", { class: "outcome", "data-label": "How it ended" }, badge(a.outcome), a.cause ? [" ", h("strong", { "data-reason": a.cause.reason }, a.cause.reason), h("div", { class: "muted" }, a.cause.message)] : ""),
          h("td", { class: "nodes", "data-label": "Nodes" }, a.nodes.join(", ") || "—"));
      }));
      events.replaceChildren(...ev.items.map((e) => h("li", { "data-reason": e.reason }, moment(e.atMs), " ", h("strong", {}, e.reason), ` (attempt ${e.attempt}) `, e.message)));
      spec.set(t.spec);
      const running = !TERMINAL.includes(t.status);
      actions.replaceChildren(
        running ? h("button", { type: "button", id: "act-stop", onclick: () => act("stop", "POST", `/api/v1/tasks/${id}/stop`, `Stop ${t.name}? Replicas get the checkpoint notice if it is on.`) }, "Stop") : "",
        !running && !t.deleted ? h("button", { type: "button", id: "act-resubmit", onclick: () => act("resubmit", "POST", `/api/v1/tasks/${id}/resubmit`, `Resubmit ${t.name} as a new attempt?`) }, "Resubmit") : "",
        h("button", { type: "button", id: "act-clone", onclick: () => { location.hash = `#/create?from=${encodeURIComponent(id)}`; } }, "Clone"),
        h("button", { type: "button", id: "act-share", hidden: sharing.hidden, onclick: () => { shareUser.focus(); shareUser.scrollIntoView({ block: "center" }); } }, "Share"),
        t.deleted ? "" : h("button", { type: "button", id: "act-delete", class: "danger", onclick: () => act("delete", "DELETE", `/api/v1/tasks/${id}`, `Delete ${t.name}? Its history stays, the task leaves the list.`) }, "Delete"),
      );
      await Promise.all([loadLogs(), loadMetrics()]);
      // While it runs the page follows it; once it ended (or after a resubmit brought it back) only the
      // relative times move, or it is followed again.
      const want = running ? "refresh" : "retick";
      if (want !== timer) {
        timer = want;
        if (running) repeat(refresh, 2000);
        else repeat(retick, 15000);
      }
    } catch (e) {
      head.replaceChildren(fail(e));
    }
  }

  // Leaving the page ends the log's stream (it would otherwise run on until the replica ends).
  window.addEventListener("hashchange", () => logAbort?.abort(), { once: true });
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

  // Sharing (the owner and admins): whom the task is shared with, each taken back with a click, and a share
  // given by name. For anyone else the list is refused (403) and the section stays hidden.
  const shareRows = h("tbody", { id: "shares" });
  const shareUser = h("input", { id: "share-user", placeholder: "user name", autocomplete: "off", spellcheck: "false" });
  const shareOperate = h("input", { type: "checkbox", id: "share-operate" });
  const shareMsg = h("p", { role: "status", "aria-live": "polite", id: "share-msg" });
  const sharing = h("section", { id: "sharing", hidden: true }, h("h2", { id: "sharing-title" }, "Sharing"));
  async function loadShares() {
    try {
      const { data } = await api("GET", `/api/v1/tasks/${id}/shares`);
      sharing.hidden = false;
      document.getElementById("act-share")?.removeAttribute("hidden");
      shareRows.replaceChildren(...data.items.map((x) => h("tr", { "data-user": x.user },
        h("td", { "data-label": "User" }, x.user), h("td", { "data-label": "May" }, x.operate ? "see and operate" : "see"),
        h("td", {}, h("button", { type: "button", class: "link", "aria-label": `take back the share of ${x.user}`, onclick: async () => {
          if (!confirm(`Take the share of ${x.user} back?`)) return;
          try {
            await api("DELETE", `/api/v1/tasks/${id}/shares/${encodeURIComponent(x.user)}`);
            shareMsg.textContent = `no longer shared with ${x.user}`;
            shareMsg.className = "ok";
            loadShares();
          } catch (e) { shareMsg.textContent = e.message; shareMsg.className = "error"; }
        } }, "Take back")))));
      if (!data.items.length) shareRows.replaceChildren(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "Shared with no one: only its owner, admins and (when public) its group's members see it.")));
    } catch (e) {
      sharing.hidden = e.status === 403 || e.status === 404;
      if (!sharing.hidden) { shareMsg.textContent = e.message; shareMsg.className = "error"; }
    }
  }
  sharing.append(
    h("div", { class: "table-wrap" }, h("table", { "aria-labelledby": "sharing-title" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "User"), h("th", { scope: "col" }, "May"), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))), shareRows)),
    h("form", { class: "row-item", onsubmit: async (ev) => {
      ev.preventDefault();
      const user = shareUser.value.trim();
      if (!user) { shareMsg.textContent = "Name the user to share with."; shareMsg.className = "error"; shareUser.focus(); return; }
      try {
        await api("POST", `/api/v1/tasks/${id}/shares`, JSON.stringify({ user, operate: shareOperate.checked }), { "Content-Type": "application/json" });
        shareMsg.textContent = `shared with ${user}${shareOperate.checked ? " (see and operate)" : " (see)"}`;
        shareMsg.className = "ok";
        shareUser.value = "";
        shareOperate.checked = false;
        loadShares();
      } catch (e) { shareMsg.textContent = e.message; shareMsg.className = "error"; }
    } },
      h("label", { for: "share-user" }, "Share with ", shareUser),
      h("label", {}, shareOperate, " may also stop, resubmit, clone and delete it"),
      h("button", { type: "submit", id: "share-submit" }, "Share")),
    shareMsg,
  );

  const table = (title, cols, body, cls) => h("div", { class: "table-wrap" }, h("table", { class: cls, "aria-labelledby": title }, h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))), body));
  show(
    head, actions,
    h("section", {}, h("h2", {}, "Overview"), overview),
    h("section", {}, h("h2", { id: "attempts-title" }, "Attempts"), table("attempts-title", ["Attempt", "Queued", "Started", "Ended", "Waited", "Ran", "How it ended", "Nodes"], attempts, "attempts")),
    h("section", {}, h("h2", { id: "replicas-title" }, "Replicas"), table("replicas-title", ["Replica", "Rank", "Node", "Resources"], replicas, "replicas")),
    h("section", {}, h("h2", {}, "Events"), events),
    h("section", { class: "logs" }, h("h2", {}, "Logs"),
      h("div", { class: "log-bar" }, logSelect, h("label", {}, follow, " follow"), download),
      logs.controls, logs.pane),
    h("section", {}, h("h2", {}, "Metrics"), chartNote, charts),
    h("section", {}, h("h2", {}, "Spec"), spec.bar, h("p", { class: "muted" }, "Hidden values are masked."), spec.pre),
    sharing,
  );
  await refresh();
  loadShares();
}
