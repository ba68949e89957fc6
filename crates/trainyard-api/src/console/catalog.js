// The catalog editor on the admin page: a form section per kind of entry (regions, clusters, instance specs,
// pools, nodes, project groups with their quota lines, images and registries, volumes, datasets, models,
// labels), over a copy of the whole catalog as GET /api/v1/catalog answers it. Each control writes only its
// own key of that copy, so whatever the form does not show (a node's GPU devices, its cordon, fields of a
// newer server) goes back unchanged. Saving PUTs the copy; the server's refusals are shown where they belong:
// conflicts with active tasks (409) with a second, deliberate "save anyway", inconsistencies (400, one line
// per entry) at the entries they name. The raw text stays one toggle away.

import { api, h } from "./core.js";

const RESOURCE_TYPES = ["Reserved", "Ondemand", "Spot", "Idle"];

// The kinds of named entries, in the order they depend on each other; `one` is how the server's messages
// name one entry ("pool default: cluster ... does not exist").
const KINDS = [
  { key: "regions", title: "Regions", one: "region" },
  { key: "clusters", title: "Clusters", one: "cluster" },
  { key: "instanceSpecs", title: "Instance specs", one: "instance spec" },
  { key: "pools", title: "Pools", one: "pool" },
  { key: "nodes", title: "Nodes", one: "node" },
  { key: "projectGroups", title: "Project groups and quotas", one: "project group" },
  { key: "images", title: "Images and registries", one: "image" },
  { key: "registries", title: null, one: "registry" },
  { key: "volumes", title: "Volumes", one: "volume" },
  { key: "datasets", title: "Datasets", one: "dataset" },
  { key: "models", title: "Models", one: "model" },
];
const ONE = Object.fromEntries(KINDS.map((k) => [k.key, k.one]));

const copy = (x) => JSON.parse(JSON.stringify(x));
// JSON with every object's keys sorted: two catalogs compare equal whatever order their keys were added in.
const canon = (x) => JSON.stringify(x, (_, v) => (v && typeof v === "object" && !Array.isArray(v)
  ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v));
const names = (m) => Object.keys(m || {}).sort();
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
// Ids from names, which may hold any character: kept readable, the rest hex-escaped.
const idOf = (...parts) => `cat-${parts.map((p) => String(p).replace(/[^A-Za-z0-9_.-]/g, (c) => `_${c.charCodeAt(0).toString(16)}`)).join("--")}`;

/// What a new entry of each kind starts as: the smallest thing the server accepts, pointing at the first
/// entry it could name.
function fresh(kind, cat) {
  const first = (k) => names(cat[k])[0] || "";
  switch (kind) {
    case "clusters": return { region: first("regions") };
    case "instanceSpecs": return { kind: "CPU", gpus: 0, vcpus: 1, memoryMib: 1024 };
    case "pools": return { cluster: first("clusters"), instanceSpecs: [] };
    case "nodes": return { pool: first("pools"), schedulable: true, gpus: 0, vcpus: 1, memoryMib: 1024 };
    case "images": return { clusters: [], ray: false, torch: false };
    case "volumes": return { clusters: [], multiPodReadWrite: false };
    case "datasets": case "models": return { clusters: [] };
    default: return {};
  }
}

/// What else in the catalog names this entry (a removal leaves those dangling, and the server refuses that).
function usedBy(cat, kind, name) {
  const out = [];
  const each = (k, f) => { for (const [n, x] of Object.entries(cat[k] || {})) if (f(x)) out.push(`${ONE[k]} ${n}`); };
  const lines = (f) => { const n = (cat.quotas || []).filter(f).length; if (n) out.push(plural(n, "quota line")); };
  const scoped = ["images", "volumes", "datasets", "models"];
  if (kind === "regions") each("clusters", (c) => c.region === name);
  if (kind === "clusters") { each("pools", (p) => p.cluster === name); scoped.forEach((k) => each(k, (x) => (x.clusters || []).includes(name))); }
  if (kind === "instanceSpecs") { each("pools", (p) => (p.instanceSpecs || []).includes(name)); lines((q) => q.spec === name); }
  if (kind === "pools") { each("nodes", (n) => n.pool === name); lines((q) => q.pool === name); }
  if (kind === "projectGroups") scoped.forEach((k) => each(k, (x) => (x.projectGroups || []).includes(name)));
  return out;
}

/// The differences between two catalogs as short phrases: "pool gpu added", "node node-c removed",
/// "instance spec cpu.small changed", "2 quota lines changed".
export function changes(a, b) {
  const out = [];
  for (const { key, one } of KINDS) {
    const x = a[key] || {}, y = b[key] || {};
    for (const n of names(y)) if (!(n in x)) out.push(`${one} ${n} added`);
    for (const n of names(x)) if (!(n in y)) out.push(`${one} ${n} removed`);
    for (const n of names(y)) if (n in x && canon(x[n]) !== canon(y[n])) out.push(`${one} ${n} changed`);
  }
  const qa = (a.quotas || []).map(canon), qb = (b.quotas || []).map(canon);
  const added = qb.filter((q) => !qa.includes(q)).length, removed = qa.filter((q) => !qb.includes(q)).length;
  if (added) out.push(`${plural(added, "quota line")} added or changed`);
  if (removed > added) out.push(`${plural(removed - added, "quota line")} removed`);
  if (canon(a.labels) !== canon(b.labels)) out.push("labels changed");
  if (!!a.allowExternalImages !== !!b.allowExternalImages) out.push("external images setting changed");
  const known = new Set([...KINDS.map((k) => k.key), "quotas", "labels", "allowExternalImages"]);
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (!known.has(k) && canon(a[k]) !== canon(b[k])) out.push(`${k} changed`);
  }
  return out;
}

// Whether the editor last shown holds unsaved changes: leaving or reloading the page asks first. One listener
// for the page's life, however often the admin page is drawn.
let shown = () => false;
window.addEventListener("beforeunload", (e) => {
  if (shown()) { e.preventDefault(); e.returnValue = ""; }
});

/// The editor. `saved(catalog)` is called with what the server answered after a save; `say(text, bad)`
/// writes the page's status line.
export function catalogEditor({ saved, say }) {
  let base = null; // the catalog in force, as last read
  let draft = null; // the copy being edited
  let asText = false;
  const open = new Set(["regions"]);
  const bad = new Map(); // control id -> what is wrong with what was typed there, and the field's path
  let refused = null; // the body the server refused for conflicts, until the draft changes

  const form = h("div", { id: "catalog-form" });
  const text = h("textarea", { id: "catalog", rows: 22, spellcheck: "false", "aria-label": "catalog (JSON or YAML)", hidden: true,
    oninput: () => { clearRefusal(); status(); } });
  const problems = h("div", { id: "catalog-problems", role: "alert" });
  const conflicts = h("div", { id: "catalog-conflicts", "aria-live": "polite" });
  // Not a live region: it changes at every keystroke; saves and refusals are announced by the page's status line.
  const pending = h("p", { id: "catalog-changes", class: "muted" });
  const toggle = h("button", { type: "button", id: "catalog-as-text", class: "link", "aria-expanded": "false", "aria-controls": "catalog", onclick: () => setMode(!asText) },
    "Advanced: edit as JSON/YAML");
  const saveButton = h("button", { type: "button", id: "save-catalog", onclick: () => save(false) }, "Save catalog");
  const discard = h("button", { type: "button", id: "discard-catalog", class: "secondary", onclick: () => {
    if (!confirm("Discard your changes to the catalog?")) return;
    load(base, true);
    say("changes discarded");
  } }, "Discard changes");

  const dirty = () => (asText ? text.value.trim() !== JSON.stringify(base, null, 2).trim() : canon(draft) !== canon(base));

  function status() {
    if (!base) return;
    const d = dirty();
    if (asText) pending.textContent = d ? "The text differs from the catalog in force." : "No unsaved changes.";
    else {
      const c = d ? changes(base, draft) : [];
      pending.textContent = d ? `Unsaved: ${c.slice(0, 6).join(", ")}${c.length > 6 ? `, and ${c.length - 6} more` : ""}.` : "No unsaved changes.";
    }
    discard.disabled = !d;
  }

  // Any edit: the draft moved away from what the server refused, so "save anyway" would force something else.
  function edited() { clearRefusal(); status(); }
  function clearRefusal() {
    if (refused !== null) { refused = null; conflicts.replaceChildren(); }
  }

  // ---- controls, each bound to one key of one object of the draft -----------------------------------------

  function field(id, label, control, path, hint, wide = false) {
    return h("div", { class: wide ? "field wide" : "field", "data-path": path },
      h("label", { for: id }, label), control,
      hint ? h("span", { class: "muted hint", id: `${id}-hint` }, hint) : null,
      bad.has(id) ? h("span", { class: "field-problem", id: `${id}-problem` }, bad.get(id).text) : null);
  }

  // `wide`: a reference or a path, given two columns where there are.
  function textField(obj, key, label, path, { optional = true, placeholder, hint, wide = false } = {}) {
    const id = idOf(path);
    const input = h("input", { id, value: obj[key] ?? "", placeholder, spellcheck: "false", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.trim();
        if (v === "" && optional) delete obj[key]; else obj[key] = v;
        edited();
      } });
    return field(id, label, input, path, hint, wide);
  }

  // Which entry a field's path is in, as people say it: "node node-d", "quota line Reserved default cpu.small".
  function where(path, obj) {
    if (path.startsWith("quotas[")) return `quota line ${obj.resourceType} ${obj.pool} ${obj.spec} of ${obj.group}`;
    const kind = path.split(".")[0];
    const name = path.slice(kind.length + 1, path.lastIndexOf("."));
    return ONE[kind] ? `${ONE[kind]} ${name}` : kind;
  }

  function numberField(obj, key, label, path, { min = 0, hint } = {}) {
    const id = idOf(path);
    // What was typed and refused stays in the field when the form is drawn again (it never reached the draft).
    const input = h("input", { id, type: "number", inputmode: "numeric", min, step: 1, value: bad.has(id) ? bad.get(id).raw : obj[key] ?? "", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.trim();
        const wrap = input.closest(".field");
        wrap.querySelector(".field-problem")?.remove();
        if (/^\d+$/.test(v) && Number(v) >= min) {
          obj[key] = Number(v);
          bad.delete(id);
          input.removeAttribute("aria-invalid");
          input.setAttribute("aria-describedby", hint ? `${id}-hint` : "");
        } else {
          bad.set(id, { text: `${label}: a whole number${min ? ` of at least ${min}` : ""}`, path, where: where(path, obj), raw: input.value });
          input.setAttribute("aria-invalid", "true");
          input.setAttribute("aria-describedby", `${hint ? `${id}-hint ` : ""}${id}-problem`);
          wrap.append(h("span", { class: "field-problem", id: `${id}-problem` }, bad.get(id).text));
        }
        edited();
      } });
    if (bad.has(id)) {
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", `${hint ? `${id}-hint ` : ""}${id}-problem`);
    }
    return field(id, label, input, path, hint);
  }

  function checkField(obj, key, label, path, { then } = {}) {
    const id = idOf(path);
    return h("div", { class: "field check", "data-path": path },
      h("input", { id, type: "checkbox", checked: !!obj[key], "data-field": key,
        onchange: (e) => { obj[key] = e.target.checked; edited(); if (then) render(); } }),
      h("label", { for: id }, label));
  }

  // `redraw`: other controls depend on this choice (a spec's kind, a quota line's pool).
  // `after`: what else follows from the choice (a CPU spec has no GPUs).
  function selectField(obj, key, label, path, options, { redraw = false, after, missing = "not in the catalog" } = {}) {
    const id = idOf(path);
    const current = obj[key] ?? "";
    const all = options.includes(current) ? options : [current, ...options];
    const sel = h("select", { id, "data-field": key, onchange: () => { obj[key] = sel.value; after?.(); edited(); if (redraw) render(); } },
      all.map((o) => h("option", { value: o, selected: o === current }, o === "" ? "(choose)" : options.includes(o) ? o : `${o} (${missing})`)));
    return field(id, label, sel, path);
  }

  // A list of names chosen from a set (a pool's instance specs, an entry's clusters or project groups).
  function pickField(obj, key, legend, path, options, emptyMeans, { redraw = false } = {}) {
    const chosen = obj[key] || [];
    const all = [...new Set([...options, ...chosen])];
    const boxes = all.map((o) => {
      const id = idOf(path, o);
      return h("span", { class: "pick" },
        h("input", { id, type: "checkbox", value: o, checked: chosen.includes(o), "data-field": key,
          onchange: (e) => {
            // The order chosen stays (a pool's first spec is the one a new task is offered first); a new
            // choice goes last.
            const now = (obj[key] || []).filter((x) => x !== o);
            obj[key] = e.target.checked ? [...now, o] : now;
            edited();
            if (redraw) render();
          } }),
        h("label", { for: id }, options.includes(o) ? o : `${o} (not in the catalog)`));
    });
    return h("fieldset", { class: "picks", "data-path": path },
      h("legend", {}, legend),
      boxes.length ? boxes : h("span", { class: "muted" }, "none in the catalog yet"),
      emptyMeans ? h("span", { class: "muted hint" }, `None chosen: ${emptyMeans}.`) : null);
  }

  // A list of words typed comma-separated (a registry's mirrors, a label's allowed values).
  function listField(obj, key, label, path, { hint, optional = false } = {}) {
    const id = idOf(path);
    const input = h("input", { id, value: (obj[key] || []).join(", "), spellcheck: "false", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.split(",").map((x) => x.trim()).filter(Boolean);
        if (!v.length && optional) delete obj[key]; else obj[key] = v;
        edited();
      } });
    return field(id, label, input, path, hint);
  }

  // ---- entries ---------------------------------------------------------------------------------------------

  // Refused numbers of fields that are gone (their entry removed) no longer hold the save back.
  function forget(gone) {
    for (const [id, b] of bad) if (gone(b.path)) bad.delete(id);
  }

  function removeEntry(kind, name) {
    const users = usedBy(draft, kind, name);
    const more = kind === "projectGroups" ? (draft.quotas || []).filter((q) => q.group === name).length : 0;
    const lines = [`Remove ${ONE[kind]} ${name} from the catalog?`];
    if (more) lines.push(`Its ${plural(more, "quota line")} go with it.`);
    if (users.length) lines.push(`Still named by: ${users.join(", ")}. The server refuses the catalog until those change too.`);
    lines.push("Nothing changes until you save.");
    if (!confirm(lines.join("\n\n"))) return;
    delete draft[kind][name];
    forget((p) => p.startsWith(`${kind}.${name}.`) || (kind === "projectGroups" && p.startsWith("quotas[")));
    if (kind === "projectGroups") draft.quotas = (draft.quotas || []).filter((q) => q.group !== name);
    edited();
    render();
    say(`${ONE[kind]} ${name} removed from the draft; save to apply`);
    document.getElementById(`add-${kind}-name`)?.focus();
  }

  function entry(kind, name, ...fields) {
    const path = `${kind}.${name}`;
    return h("fieldset", { class: "entry", "data-entry": `${kind}/${name}`, id: idOf(kind, name) },
      // The legend names the group for assistive technology ("pool default"); Remove sits on the frame's
      // right, outside it.
      h("legend", {}, h("span", { class: "visually-hidden" }, `${ONE[kind]} `), h("span", { class: "mono" }, name)),
      h("button", { type: "button", class: "link danger-link remove-entry", "data-action": "remove", "aria-label": `remove ${ONE[kind]} ${name}`,
        onclick: () => removeEntry(kind, name) }, "Remove"),
      h("div", { class: "entry-problems", "data-path": path }),
      h("div", { class: "fields" }, fields));
  }

  const scopes = (x, kind, name) => [
    pickField(x, "clusters", "Offered in clusters", `${kind}.${name}.clusters`, names(draft.clusters), "every cluster"),
    pickField(x, "projectGroups", "Offered to project groups", `${kind}.${name}.projectGroups`, names(draft.projectGroups),
      kind === "images" && name === "host" ? "admins only (this machine's own root)" : "every group"),
  ];

  const ENTRY = {
    regions: (x, n) => [textField(x, "displayName", "Display name", `regions.${n}.displayName`)],
    clusters: (x, n) => [
      selectField(x, "region", "Region", `clusters.${n}.region`, names(draft.regions)),
      textField(x, "context", "Kubeconfig context", `clusters.${n}.context`, { hint: "Kubernetes backend; empty: the server's default" }),
    ],
    instanceSpecs: (x, n) => [
      selectField(x, "kind", "Kind", `instanceSpecs.${n}.kind`, ["CPU", "GPU"], { redraw: true, after: () => {
        // The server's rule: a GPU spec names its model and has GPUs, a CPU spec has neither.
        if (x.kind === "CPU") { delete x.gpuModel; x.gpus = 0; } else if (!x.gpus) x.gpus = 1;
      } }),
      ...(x.kind === "GPU" ? [
        textField(x, "gpuModel", "GPU model", `instanceSpecs.${n}.gpuModel`, { placeholder: "A100" }),
        numberField(x, "gpus", "GPUs", `instanceSpecs.${n}.gpus`, { min: 1 }),
      ] : []),
      numberField(x, "vcpus", "vCPUs", `instanceSpecs.${n}.vcpus`, { min: 1 }),
      numberField(x, "memoryMib", "Memory (MiB)", `instanceSpecs.${n}.memoryMib`, { min: 1 }),
    ],
    pools: (x, n) => [
      selectField(x, "cluster", "Cluster", `pools.${n}.cluster`, names(draft.clusters)),
      pickField(x, "instanceSpecs", "Instance specs offered", `pools.${n}.instanceSpecs`, names(draft.instanceSpecs), null, { redraw: true }),
    ],
    nodes: (x, n) => [
      selectField(x, "pool", "Pool", `nodes.${n}.pool`, names(draft.pools)),
      textField(x, "gpuModel", "GPU model", `nodes.${n}.gpuModel`, { hint: "empty for a CPU node" }),
      numberField(x, "gpus", "GPUs", `nodes.${n}.gpus`),
      numberField(x, "vcpus", "vCPUs", `nodes.${n}.vcpus`, { min: 1 }),
      numberField(x, "memoryMib", "Memory (MiB)", `nodes.${n}.memoryMib`, { min: 1 }),
      (x.gpuDevices || []).length ? h("p", { class: "muted hint", "data-path": `nodes.${n}.gpuDevices` },
        `Hands out GPU devices ${x.gpuDevices.join(", ")} (edit as JSON to change).`) : null,
      x.failed || x.schedulable === false ? h("p", { class: "muted hint" }, x.failed ? "Marked failed (see Nodes above)." : "Cordoned (see Nodes above).") : null,
    ],
    projectGroups: (x, n) => [textField(x, "displayName", "Display name", `projectGroups.${n}.displayName`), quotaLines(n)],
    images: (x, n) => [
      textField(x, "reference", "Registry reference", `images.${n}.reference`, { placeholder: "registry.example/team/image:tag", hint: "or a root file system, not both", wide: true }),
      textField(x, "rootfs", "Root file system (local backend)", `images.${n}.rootfs`, { placeholder: "/srv/images/NAME", wide: true }),
      h("div", { class: "checks" }, checkField(x, "torch", "Carries PyTorch", `images.${n}.torch`), checkField(x, "ray", "Carries Ray", `images.${n}.ray`)),
      ...scopes(x, "images", n),
    ],
    registries: (x, n) => [
      listField(x, "mirrors", "Mirrors, tried first", `registries.${n}.mirrors`, { hint: "host[:port], comma-separated", optional: true }),
      checkField(x, "insecure", "Plain HTTP (a trusted network only)", `registries.${n}.insecure`),
      textField(x, "caBundle", "CA bundle (PEM file)", `registries.${n}.caBundle`, { wide: true }),
    ],
    volumes: (x, n) => [
      checkField(x, "multiPodReadWrite", "Several pods may write at once", `volumes.${n}.multiPodReadWrite`),
      textField(x, "path", "Directory (local backend)", `volumes.${n}.path`, { hint: `empty: volumes/${n} in the data dir`, wide: true }),
      ...scopes(x, "volumes", n),
    ],
    datasets: (x, n) => [textField(x, "path", "Directory (local backend)", `datasets.${n}.path`, { hint: `empty: datasets/${n} in the data dir`, wide: true }), ...scopes(x, "datasets", n)],
    models: (x, n) => [textField(x, "path", "Directory (local backend)", `models.${n}.path`, { hint: `empty: models/${n} in the data dir`, wide: true }), ...scopes(x, "models", n)],
  };

  // A group's quota lines: one per resource type, pool and instance spec, in spec units.
  function quotaLines(group) {
    const rows = [];
    (draft.quotas || []).forEach((q, i) => {
      if (q.group !== group) return;
      const path = `quotas[${i}]`;
      const specs = draft.pools?.[q.pool]?.instanceSpecs || [];
      rows.push(h("div", { class: "quota-line", role: "group", "aria-label": `quota line: ${q.resourceType} ${q.pool} ${q.spec}`, "data-index": i, "data-path": path },
        selectField(q, "resourceType", "Type", `${path}.resourceType`, RESOURCE_TYPES),
        selectField(q, "pool", "Pool", `${path}.pool`, names(draft.pools), { redraw: true, after: () => {
          const offered = draft.pools?.[q.pool]?.instanceSpecs || [];
          if (!offered.includes(q.spec)) q.spec = offered[0] || "";
        } }),
        selectField(q, "spec", "Spec", `${path}.spec`, specs, { missing: "not offered by the pool" }),
        numberField(q, "units", "Units", `${path}.units`),
        h("button", { type: "button", class: "link danger-link", "data-action": "remove-quota", "aria-label": `remove the ${q.resourceType} quota line of ${group} for ${q.pool} ${q.spec}`,
          onclick: () => {
            if (!confirm(`Remove the quota line ${q.resourceType} ${q.pool} ${q.spec} (${q.units} units) of ${group}? Nothing changes until you save.`)) return;
            draft.quotas.splice(i, 1);
            // The lines after it move up a place: what was refused in any line is forgotten with it.
            forget((p) => p.startsWith("quotas["));
            edited();
            render();
            document.getElementById(idOf("add-quota", group))?.focus();
          } }, "Remove")));
    });
    return h("fieldset", { class: "quotas", "data-path": `projectGroups.${group}.quotas` },
      h("legend", {}, "Quota, in spec units"),
      rows.length ? rows : h("p", { class: "muted" }, "No quota: Reserved tasks of this group cannot run."),
      h("button", { type: "button", class: "add", id: idOf("add-quota", group), disabled: !names(draft.pools).length,
        onclick: () => {
          const pool = names(draft.pools)[0];
          draft.quotas = draft.quotas || [];
          draft.quotas.push({ group, resourceType: "Reserved", pool, spec: draft.pools[pool].instanceSpecs?.[0] || "", units: 1 });
          edited();
          render();
          document.getElementById(idOf(`quotas[${draft.quotas.length - 1}].units`))?.focus();
        } }, "Add quota line"));
  }

  function addRow(kind) {
    const id = `add-${kind}-name`;
    const input = h("input", { id, spellcheck: "false", autocomplete: "off", "aria-describedby": `${id}-problem`,
      onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); add(); } } });
    const problem = h("span", { class: "field-problem", id: `${id}-problem`, "aria-live": "polite" });
    function add() {
      const name = input.value.trim();
      const why = !name ? "give it a name"
        : /\s/.test(name) ? "a name without spaces"
        : name in (draft[kind] || {}) ? `there is already a ${ONE[kind]} ${name}` : "";
      if (why) { problem.textContent = why; input.setAttribute("aria-invalid", "true"); input.focus(); return; }
      draft[kind] = draft[kind] || {};
      draft[kind][name] = fresh(kind, draft);
      edited();
      render();
      const el = document.getElementById(idOf(kind, name));
      el?.scrollIntoView({ block: "nearest" });
      (el?.querySelector(".fields input, .fields select") || el?.querySelector("button"))?.focus();
      say(`${ONE[kind]} ${name} added to the draft; save to apply`);
    }
    return h("div", { class: "add-row" },
      h("div", { class: "field" }, h("label", { for: id }, `New ${ONE[kind]}`), input, problem),
      h("button", { type: "button", class: "add", id: `add-${kind}`, onclick: add }, `Add ${ONE[kind]}`));
  }

  function entries(kind) {
    const list = names(draft[kind]).map((n) => entry(kind, n, ...ENTRY[kind](draft[kind][n], n)));
    return [list.length ? list : h("p", { class: "muted" }, `No ${ONE[kind]} yet.`), addRow(kind)];
  }

  function labels() {
    draft.labels = draft.labels || { validation: false, maintained: {} };
    const l = draft.labels;
    l.maintained = l.maintained || {};
    const keyId = "add-label-key";
    const key = h("input", { id: keyId, spellcheck: "false", autocomplete: "off", onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); addKey(); } } });
    const problem = h("span", { class: "field-problem", "aria-live": "polite" });
    function addKey() {
      const k = key.value.trim();
      if (!k || k in l.maintained) { problem.textContent = k ? `${k} is maintained already` : "give the label key"; key.focus(); return; }
      l.maintained[k] = [];
      edited();
      render();
      document.getElementById(idOf("labels.maintained", k))?.focus();
    }
    return [
      h("div", { class: "field check" },
        h("input", { type: "checkbox", id: "label-validation", checked: !!l.validation, onchange: (e) => { l.validation = e.target.checked; edited(); } }),
        h("label", { for: "label-validation" }, "Tasks must use maintained labels")),
      names(l.maintained).map((k) => h("div", { class: "label-line", "data-entry": `labels/${k}`, "data-path": `labels.maintained.${k}` },
        listField(l.maintained, k, `Allowed values of ${k}`, `labels.maintained.${k}`, { hint: "comma-separated; empty: any value" }),
        h("button", { type: "button", class: "link danger-link", "data-action": "remove", "aria-label": `remove maintained label ${k}`, onclick: () => {
          if (!confirm(`Stop maintaining the label ${k}? Nothing changes until you save.`)) return;
          delete l.maintained[k];
          edited();
          render();
          key.focus();
        } }, "Remove"))),
      h("div", { class: "add-row" },
        h("div", { class: "field" }, h("label", { for: keyId }, "New maintained label key"), key, problem),
        h("button", { type: "button", class: "add", id: "add-label-key-button", onclick: addKey }, "Add label")),
    ];
  }

  function section(kind, title, count, ...body) {
    const d = h("details", { "data-kind": kind, open: open.has(kind), ontoggle: () => { if (d.open) open.add(kind); else open.delete(kind); } },
      h("summary", { id: `catalog-${kind}` }, h("span", { class: "summary-title" }, title), " ", h("span", { class: "count" }, count)),
      h("div", { class: "section-body" }, body.flat(Infinity)));
    return d;
  }

  function render() {
    if (asText || !draft) return;
    const focused = document.activeElement?.id;
    const y = window.scrollY;
    const n = (k) => names(draft[k]).length;
    form.replaceChildren(
      ...["regions", "clusters", "instanceSpecs", "pools", "nodes"].map((k) => section(k, KINDS.find((x) => x.key === k).title, n(k), entries(k))),
      section("projectGroups", "Project groups and quotas", `${n("projectGroups")} · ${plural((draft.quotas || []).length, "quota line")}`, entries("projectGroups")),
      section("images", "Images and registries", `${n("images")} · ${plural(n("registries"), "registry", "registries")}`,
        entries("images"),
        h("h4", {}, "External images"),
        checkField(draft, "allowExternalImages", "Tasks may use images outside the catalog", "allowExternalImages"),
        h("p", { class: "muted" }, "Registries such images may come from, and how they are reached (none listed: any registry)."),
        entries("registries")),
      ...["volumes", "datasets", "models"].map((k) => section(k, KINDS.find((x) => x.key === k).title, n(k), entries(k))),
      section("labels", "Labels", `${plural(names(draft.labels?.maintained).length, "maintained key")}${draft.labels?.validation ? ", enforced" : ""}`, labels()),
    );
    if (focused) document.getElementById(focused)?.focus({ preventScroll: true });
    window.scrollTo(0, y);
    status();
  }

  function setMode(text_) {
    if (text_ === asText) return;
    if (text_) {
      text.value = JSON.stringify(draft, null, 2);
    } else {
      let parsed;
      try { parsed = JSON.parse(text.value); } catch {
        if (text.value.trim() !== JSON.stringify(draft, null, 2).trim()
          && !confirm("The form reads JSON only, and this text is not JSON (YAML, perhaps). Save it first to keep it. Back to the form without it?")) return;
        parsed = draft;
      }
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) { say("the catalog is a JSON object; fix the text first", true); return; }
      draft = parsed;
    }
    asText = text_;
    text.hidden = !asText;
    form.hidden = asText;
    toggle.textContent = asText ? "Back to the form" : "Advanced: edit as JSON/YAML";
    toggle.setAttribute("aria-expanded", String(asText));
    clearRefusal();
    render();
    status();
    (asText ? text : toggle).focus();
  }

  // ---- the server's answers ----------------------------------------------------------------------------------

  // Where a problem belongs: an element whose data-path is the problem's path or the longest prefix of it.
  function placeFor(path) {
    const dotted = path.replace(/\[(\d+)\]/g, "[$1]");
    for (let p = dotted; p; p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "") {
      const el = form.querySelector(`[data-path="${CSS.escape(p)}"]`);
      if (el) return el;
    }
    return null;
  }

  // The server's inconsistency lines ("pool gpu: cluster \"x\" does not exist", "quota: pool \"p\" does not
  // offer \"s\"") as (path, message) pairs: the entry a line names, and the quota lines a quota line means.
  function locate(line, cat) {
    for (const { key, one } of [...KINDS].sort((a, b) => b.one.length - a.one.length)) {
      for (const n of names(cat[key])) {
        if (line.startsWith(`${one} ${n}: `)) return [{ path: `${key}.${n}`, message: line.slice(one.length + n.length + 3) }];
      }
    }
    const m = line.match(/^quota: (.*)$/);
    if (!m) return [];
    const quoted = [...m[1].matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((x) => { try { return JSON.parse(`"${x[1]}"`); } catch { return x[1]; } });
    const match = /^project group/.test(m[1]) ? (q) => q.group === quoted[0]
      : /does not offer/.test(m[1]) ? (q) => q.pool === quoted[0] && q.spec === quoted[1]
      : /^pool/.test(m[1]) ? (q) => q.pool === quoted[0] : null;
    if (!match) return [];
    return (cat.quotas || []).flatMap((q, i) => (match(q) ? [{ path: `quotas[${i}]`, message: m[1] }] : []));
  }

  function showProblems(title, items) {
    form.querySelectorAll(".server-problem").forEach((e) => e.remove());
    if (!items.length) { problems.replaceChildren(); return; }
    const list = items.map(({ text: t, path, inline = true }) => {
      const place = path && !asText ? placeFor(path) : null;
      if (place && inline) {
        const where = place.matches(".entry-problems") || place.matches(".field, .quota-line, fieldset, .label-line") ? place : place.parentElement;
        where.append(h("span", { class: "field-problem server-problem", role: "note" }, t));
        const details = place.closest("details");
        if (details && !details.open) { details.open = true; open.add(details.dataset.kind); }
      }
      return h("li", { "data-path": path || "" }, place
        ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); place.closest("fieldset, .quota-line, .field")?.scrollIntoView({ block: "center" }); (place.matches(".field") ? place : place.closest("fieldset"))?.querySelector("input, select, button")?.focus(); } }, t)
        : t);
    });
    const heading = h("h4", { tabindex: "-1" }, title);
    problems.replaceChildren(h("div", { class: "problem-box" }, heading, h("ul", {}, list)));
    heading.scrollIntoView({ block: "nearest" });
  }

  function showConflicts(body, err) {
    const items = err.body.conflicts || [];
    const total = items.reduce((a, c) => a + c.tasks, 0);
    refused = body;
    conflicts.replaceChildren(h("div", { class: "problem-box conflicts", role: "alert" },
      h("h4", {}, "Not saved: this catalog takes away what active tasks use"),
      h("ul", {}, items.map((c) => h("li", { "data-code": c.code, "data-path": c.path },
        h("strong", {}, c.message), h("br"),
        h("span", { class: "muted" }, `${plural(c.tasks, "active task")}: ${c.taskNames.join(", ")}${c.tasks > c.taskNames.length ? `, and ${c.tasks - c.taskNames.length} more` : ""} (at ${c.path}, ${c.code})`)))),
      h("p", {}, "Keep what they use until they end, or save anyway: queued tasks that no longer fit wait, running ones are left to the backend."),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "secondary", id: "keep-editing", onclick: () => { clearRefusal(); saveButton.focus(); } }, "Keep editing"),
        h("button", { type: "button", class: "danger", id: "save-anyway", onclick: () => {
          if (!confirm(`Save the catalog anyway? It takes away what ${plural(total, "active task")} use (listed above).`)) return;
          save(true);
        } }, "Save anyway"))));
    conflicts.querySelector("#save-anyway").focus();
  }

  async function save(force) {
    const body = force ? refused : asText ? text.value : JSON.stringify(draft);
    if (body === null) return;
    showProblems("", []);
    if (!force) {
      clearRefusal();
      if (!asText && bad.size) {
        showProblems("Fix these first", [...bad.values()].map((b) => ({ text: `${b.where}, ${b.text}`, path: b.path, inline: false })));
        return;
      }
      if (!dirty() && !confirm("Nothing changed. Save the same catalog again?")) return;
      try {
        // Someone else (another admin, a node action on this page) changed it since it was read.
        const { data: now } = await api("GET", "/api/v1/catalog");
        if (canon(now) !== canon(base)
          && !confirm(`The catalog in force changed since you began (${changes(base, now).slice(0, 4).join(", ") || "details"}). Save yours over it?`)) return;
      } catch (e) { say(e.message, true); return; }
      const what = asText ? "the text as the catalog" : changes(base, draft).join(", ") || "the catalog unchanged";
      if (!confirm(`Replace the catalog? ${what}.`)) return;
    }
    saveButton.disabled = true;
    try {
      const { data } = await api("PUT", `/api/v1/admin/catalog${force ? "?force=true" : ""}`, body);
      clearRefusal();
      load(data, true);
      if (asText) text.value = JSON.stringify(data, null, 2);
      say(force ? "catalog saved anyway" : "catalog saved");
      saved(data);
    } catch (e) {
      if (e.status === 409 && e.body?.conflicts) { say("not saved: active tasks use what the catalog takes away", true); showConflicts(body, e); }
      else if (e.status === 422 && Array.isArray(e.body?.problems)) {
        say("not saved: the catalog has problems", true);
        showProblems("The server found problems", e.body.problems.map((p) => ({ text: p.message, path: p.path })));
      } else if (e.status === 400 && typeof e.body?.detail === "string") {
        say("not saved: the catalog has problems", true);
        const [head, ...rest] = e.body.detail.split("\n");
        const cat = asText ? (() => { try { return JSON.parse(text.value); } catch { return {}; } })() : draft;
        const items = rest.length
          ? rest.map((l) => l.trim()).filter(Boolean).flatMap((l) => {
            const at = locate(l, cat);
            return at.length ? at.map((a) => ({ text: l, path: a.path })) : [{ text: l }];
          })
          : [{ text: head }];
        showProblems(rest.length ? "The server refused the catalog: it does not hold together" : "The server refused the catalog", items);
        // The same line may be placed at several quota lines; the list names it once.
        const seen = new Set();
        problems.querySelectorAll("li").forEach((li) => { if (seen.has(li.textContent)) li.remove(); else seen.add(li.textContent); });
      } else say(e.message, true);
    } finally { saveButton.disabled = false; }
  }

  /// Takes the catalog in force. With unsaved edits (and not `reset`), the draft stays: only what the form
  /// never edits (nodes' cordon and failed marks, which the Nodes table sets) is brought over from it.
  function load(cat, reset = false) {
    const keep = base && draft && !reset && dirty();
    if (keep) {
      const nodeStates = (into) => {
        for (const [n, node] of Object.entries(cat.nodes || {})) {
          const d = into.nodes?.[n];
          if (d) for (const k of ["schedulable", "failed"]) { if (k in node) d[k] = node[k]; else delete d[k]; }
        }
      };
      nodeStates(draft);
      nodeStates(base);
    } else {
      base = copy(cat);
      draft = copy(cat);
      bad.clear();
      if (asText) text.value = JSON.stringify(cat, null, 2);
    }
    render();
    status();
  }

  shown = () => form.isConnected && base !== null && dirty();

  // The save bar stays in view at the top while the form scrolls under it; what a save refused shows below it.
  const element = h("div", { class: "catalog-editor" },
    h("p", { class: "muted" }, "Changes are a draft until you save; the server checks the whole catalog, and refuses one that takes away what active tasks use. ", toggle),
    h("div", { class: "save-bar" }, pending, h("div", { class: "actions" }, discard, saveButton)),
    problems, conflicts, form, text);
  return { element, load, dirty };
}
