// @ts-check
// The catalog editor's form: a section per kind of entry, an entry's fields, a group's quota lines, the rows
// that add entries, and the maintained labels. Adding and removing change the draft and draw the form again;
// nothing reaches the server until the editor saves.

import { h } from "./core.js";
import { fieldControls } from "./catalog-fields.js";
import { fresh, idOf, KINDS, names, ONE, plural, RESOURCE_TYPES, usedBy } from "./catalog-model.js";

/** The form's parts, over the editor's state and callbacks.
 * @param {import("./catalog-model.js").Editor} ed
 */
export function catalogForm(ed) {
  const st = ed.st;
  const { textField, numberField, checkField, selectField, pickField, listField } = fieldControls(ed);

  // Refused numbers of fields that are gone (their entry removed) no longer hold the save back.
  function forget(gone) {
    for (const [id, b] of st.bad) if (gone(b.path)) st.bad.delete(id);
  }

  function removeEntry(kind, name) {
    const users = usedBy(st.draft, kind, name);
    const more = kind === "projectGroups" ? (st.draft.quotas || []).filter((q) => q.group === name).length : 0;
    const lines = [`Remove ${ONE[kind]} ${name} from the catalog?`];
    if (more) lines.push(`Its ${plural(more, "quota line")} go with it.`);
    if (users.length) lines.push(`Still named by: ${users.join(", ")}. The server refuses the catalog until those change too.`);
    lines.push("Nothing changes until you save.");
    if (!confirm(lines.join("\n\n"))) return;
    delete st.draft[kind][name];
    forget((p) => p.startsWith(`${kind}.${name}.`) || (kind === "projectGroups" && p.startsWith("quotas[")));
    if (kind === "projectGroups") st.draft.quotas = (st.draft.quotas || []).filter((q) => q.group !== name);
    ed.edited();
    ed.render();
    ed.say(`${ONE[kind]} ${name} removed from the draft; save to apply`);
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
    pickField(x, "clusters", "Offered in clusters", `${kind}.${name}.clusters`, names(st.draft.clusters), "every cluster"),
    pickField(x, "projectGroups", "Offered to project groups", `${kind}.${name}.projectGroups`, names(st.draft.projectGroups),
      kind === "images" && name === "host" ? "admins only (this machine's own root)" : "every group"),
  ];

  const ENTRY = {
    regions: (x, n) => [textField(x, "displayName", "Display name", `regions.${n}.displayName`)],
    clusters: (x, n) => [
      selectField(x, "region", "Region", `clusters.${n}.region`, names(st.draft.regions)),
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
      selectField(x, "cluster", "Cluster", `pools.${n}.cluster`, names(st.draft.clusters)),
      pickField(x, "instanceSpecs", "Instance specs offered", `pools.${n}.instanceSpecs`, names(st.draft.instanceSpecs), null, { redraw: true }),
    ],
    nodes: (x, n) => [
      selectField(x, "pool", "Pool", `nodes.${n}.pool`, names(st.draft.pools)),
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
    (st.draft.quotas || []).forEach((q, i) => {
      if (q.group !== group) return;
      const path = `quotas[${i}]`;
      const specs = st.draft.pools?.[q.pool]?.instanceSpecs || [];
      rows.push(h("div", { class: "quota-line", role: "group", "aria-label": `quota line: ${q.resourceType} ${q.pool} ${q.spec}`, "data-index": i, "data-path": path },
        selectField(q, "resourceType", "Type", `${path}.resourceType`, RESOURCE_TYPES),
        selectField(q, "pool", "Pool", `${path}.pool`, names(st.draft.pools), { redraw: true, after: () => {
          const offered = st.draft.pools?.[q.pool]?.instanceSpecs || [];
          if (!offered.includes(q.spec)) q.spec = offered[0] || "";
        } }),
        selectField(q, "spec", "Spec", `${path}.spec`, specs, { missing: "not offered by the pool" }),
        numberField(q, "units", "Units", `${path}.units`),
        h("button", { type: "button", class: "link danger-link", "data-action": "remove-quota", "aria-label": `remove the ${q.resourceType} quota line of ${group} for ${q.pool} ${q.spec}`,
          onclick: () => {
            if (!confirm(`Remove the quota line ${q.resourceType} ${q.pool} ${q.spec} (${q.units} units) of ${group}? Nothing changes until you save.`)) return;
            st.draft.quotas.splice(i, 1);
            // The lines after it move up a place: what was refused in any line is forgotten with it.
            forget((p) => p.startsWith("quotas["));
            ed.edited();
            ed.render();
            document.getElementById(idOf("add-quota", group))?.focus();
          } }, "Remove")));
    });
    return h("fieldset", { class: "quotas", "data-path": `projectGroups.${group}.quotas` },
      h("legend", {}, "Quota, in spec units"),
      rows.length ? rows : h("p", { class: "muted" }, "No quota: Reserved tasks of this group cannot run."),
      h("button", { type: "button", class: "add", id: idOf("add-quota", group), disabled: !names(st.draft.pools).length,
        onclick: () => {
          const pool = names(st.draft.pools)[0];
          st.draft.quotas = st.draft.quotas || [];
          st.draft.quotas.push({ group, resourceType: "Reserved", pool, spec: st.draft.pools[pool].instanceSpecs?.[0] || "", units: 1 });
          ed.edited();
          ed.render();
          document.getElementById(idOf(`quotas[${st.draft.quotas.length - 1}].units`))?.focus();
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
        : name in (st.draft[kind] || {}) ? `there is already a ${ONE[kind]} ${name}` : "";
      if (why) { problem.textContent = why; input.setAttribute("aria-invalid", "true"); input.focus(); return; }
      st.draft[kind] = st.draft[kind] || {};
      st.draft[kind][name] = fresh(kind, st.draft);
      ed.edited();
      ed.render();
      const el = document.getElementById(idOf(kind, name));
      el?.scrollIntoView({ block: "nearest" });
      /** @type {HTMLElement | null | undefined} */ (el?.querySelector(".fields input, .fields select") || el?.querySelector("button"))?.focus();
      ed.say(`${ONE[kind]} ${name} added to the draft; save to apply`);
    }
    return h("div", { class: "add-row" },
      h("div", { class: "field" }, h("label", { for: id }, `New ${ONE[kind]}`), input, problem),
      h("button", { type: "button", class: "add", id: `add-${kind}`, onclick: add }, `Add ${ONE[kind]}`));
  }

  function entries(kind) {
    const list = names(st.draft[kind]).map((n) => entry(kind, n, ...ENTRY[kind](st.draft[kind][n], n)));
    return [list.length ? list : h("p", { class: "muted" }, `No ${ONE[kind]} yet.`), addRow(kind)];
  }

  function labels() {
    st.draft.labels = st.draft.labels || { validation: false, maintained: {} };
    const l = st.draft.labels;
    l.maintained = l.maintained || {};
    const keyId = "add-label-key";
    const key = h("input", { id: keyId, spellcheck: "false", autocomplete: "off", onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); addKey(); } } });
    const problem = h("span", { class: "field-problem", "aria-live": "polite" });
    function addKey() {
      const k = key.value.trim();
      if (!k || k in l.maintained) { problem.textContent = k ? `${k} is maintained already` : "give the label key"; key.focus(); return; }
      l.maintained[k] = [];
      ed.edited();
      ed.render();
      document.getElementById(idOf("labels.maintained", k))?.focus();
    }
    return [
      h("div", { class: "field check" },
        h("input", { type: "checkbox", id: "label-validation", checked: !!l.validation, onchange: (e) => { l.validation = e.target.checked; ed.edited(); } }),
        h("label", { for: "label-validation" }, "Tasks must use maintained labels")),
      names(l.maintained).map((k) => h("div", { class: "label-line", "data-entry": `labels/${k}`, "data-path": `labels.maintained.${k}` },
        listField(l.maintained, k, `Allowed values of ${k}`, `labels.maintained.${k}`, { hint: "comma-separated; empty: any value" }),
        h("button", { type: "button", class: "link danger-link", "data-action": "remove", "aria-label": `remove maintained label ${k}`, onclick: () => {
          if (!confirm(`Stop maintaining the label ${k}? Nothing changes until you save.`)) return;
          delete l.maintained[k];
          ed.edited();
          ed.render();
          key.focus();
        } }, "Remove"))),
      h("div", { class: "add-row" },
        h("div", { class: "field" }, h("label", { for: keyId }, "New maintained label key"), key, problem),
        h("button", { type: "button", class: "add", id: "add-label-key-button", onclick: addKey }, "Add label")),
    ];
  }

  function section(kind, title, count, ...body) {
    const d = h("details", { "data-kind": kind, open: st.open.has(kind), ontoggle: () => { if (d.open) st.open.add(kind); else st.open.delete(kind); } },
      h("summary", { id: `catalog-${kind}` }, h("span", { class: "summary-title" }, title), " ", h("span", { class: "count" }, count)),
      h("div", { class: "section-body" }, body.flat(Infinity)));
    return d;
  }

  /// The form's sections, drawn from the draft.
  function sections() {
    const n = (k) => names(st.draft[k]).length;
    return [
      ...["regions", "clusters", "instanceSpecs", "pools", "nodes"].map((k) => section(k, KINDS.find((x) => x.key === k).title, n(k), entries(k))),
      section("projectGroups", "Project groups and quotas", `${n("projectGroups")} · ${plural((st.draft.quotas || []).length, "quota line")}`, entries("projectGroups")),
      section("images", "Images and registries", `${n("images")} · ${plural(n("registries"), "registry", "registries")}`,
        entries("images"),
        h("h4", {}, "External images"),
        checkField(st.draft, "allowExternalImages", "Tasks may use images outside the catalog", "allowExternalImages"),
        h("p", { class: "muted" }, "Registries such images may come from, and how they are reached (none listed: any registry)."),
        entries("registries")),
      ...["volumes", "datasets", "models"].map((k) => section(k, KINDS.find((x) => x.key === k).title, n(k), entries(k))),
      section("labels", "Labels", `${plural(names(st.draft.labels?.maintained).length, "maintained key")}${st.draft.labels?.validation ? ", enforced" : ""}`, labels()),
    ];
  }

  return { sections };
}
