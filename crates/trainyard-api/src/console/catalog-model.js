// @ts-check
// The catalog editor's model: the kinds of entries, what a new one starts as, what names what, the differences
// between two catalogs, and where the server's messages point. Pure functions of their arguments: no DOM, no
// state; the rest of the editor (catalog.js, catalog-fields.js, catalog-entries.js, catalog-answers.js) is
// built on them.

/** A catalog as GET /api/v1/catalog answers it: kinds of named entries, quota lines, labels, and whatever a
 * newer server adds (kept as it is).
 * @typedef {Record<string, any>} Catalog */

/** What was typed into a number field and refused: it never reached the draft, and holds the save back.
 * @typedef {object} BadInput
 * @property {string} text what is wrong, as the field shows it
 * @property {string} path the field's path in the catalog (`nodes.node-a.gpus`, `quotas[2].units`)
 * @property {string} where the entry it is in, as people say it
 * @property {string} raw what was typed
 */

/** The editor's state, shared by its modules; `base` and `draft` are replaced, never captured.
 * @typedef {object} EditorState
 * @property {Catalog | null} base the catalog in force, as last read
 * @property {Catalog | null} draft the copy being edited
 * @property {boolean} asText whether the raw text is shown instead of the form
 * @property {Set<string>} open the sections shown open
 * @property {Map<string, BadInput>} bad control id -> what is wrong with what was typed there
 * @property {string | null} refused the body the server refused for conflicts, until the draft changes
 */

/** What the form's modules call back into the editor.
 * @typedef {object} Editor
 * @property {EditorState} st
 * @property {() => void} edited any edit: clears a refusal and updates the unsaved-changes line
 * @property {() => void} render draws the form again from the draft
 * @property {(text: string, bad?: boolean) => void} say writes the page's status line
 */

export const RESOURCE_TYPES = ["Reserved", "Ondemand", "Spot", "Idle"];

// The kinds of named entries, in the order they depend on each other; `one` is how the server's messages
// name one entry ("pool default: cluster ... does not exist").
export const KINDS = [
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
export const ONE = Object.fromEntries(KINDS.map((k) => [k.key, k.one]));

export const copy = (x) => JSON.parse(JSON.stringify(x));
// JSON with every object's keys sorted: two catalogs compare equal whatever order their keys were added in.
export const canon = (x) => JSON.stringify(x, (_, v) => (v && typeof v === "object" && !Array.isArray(v)
  ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v));
export const names = (m) => Object.keys(m || {}).sort();
export const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
// Ids from names, which may hold any character: kept readable, the rest hex-escaped.
export const idOf = (...parts) => `cat-${parts.map((p) => String(p).replace(/[^A-Za-z0-9_.-]/g, (c) => `_${c.charCodeAt(0).toString(16)}`)).join("--")}`;

/// What a new entry of each kind starts as: the smallest thing the server accepts, pointing at the first
/// entry it could name.
export function fresh(kind, cat) {
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
export function usedBy(cat, kind, name) {
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

// Which entry a field's path is in, as people say it: "node node-d", "quota line Reserved default cpu.small".
export function where(path, obj) {
  if (path.startsWith("quotas[")) return `quota line ${obj.resourceType} ${obj.pool} ${obj.spec} of ${obj.group}`;
  const kind = path.split(".")[0];
  const name = path.slice(kind.length + 1, path.lastIndexOf("."));
  return ONE[kind] ? `${ONE[kind]} ${name}` : kind;
}

// The server's inconsistency lines ("pool gpu: cluster \"x\" does not exist", "quota: pool \"p\" does not
// offer \"s\"") as (path, message) pairs: the entry a line names, and the quota lines a quota line means.
export function locate(line, cat) {
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
