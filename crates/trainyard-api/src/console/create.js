// @ts-check
// The Create Training form.

import { api, fail, h, show } from "./core.js";

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

export async function createPage(params) {
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
  // A variable: name, value and whether it is hidden (write-only: masked wherever the task is shown).
  const envRow = (p) => [
    text(`${p}.name`, "Name"), text(`${p}.value`, "Value", { placeholder: getPath(doc, `${p}.hidden`) && !getPath(doc, `${p}.value`) ? "hidden: enter the value" : undefined }),
    check1(`${p}.hidden`, "Hidden (write-only)")];
  const noneIn = (kind, m) => (inCluster(m).length ? "" : `No ${kind} in the catalog for this cluster and project group; an admin adds them.`);
  // A volume row: its mount path starts as /volume/NAME and follows the volume chosen until it is edited.
  const volumeRow = (p) => {
    const f = select(`${p}.volume`, "Volume", inCluster(cat.volumes));
    const sel = f.querySelector("select");
    let prev = getPath(doc, `${p}.volume`);
    sel?.addEventListener("change", () => {
      if (getPath(doc, `${p}.mountPath`) === joinPath("/volume", prev)) {
        setPath(doc, `${p}.mountPath`, joinPath("/volume", sel.value));
        const mp = /** @type {HTMLInputElement | null} */ (document.getElementById(`in-${p}.mountPath`));
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
        list("spec.environment.env", "Environment variables", () => ({ name: "", value: "" }), envRow),
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
          num("spec.advanced.precheck.minAllreduceGbps", "Minimum all-reduce GB/s", { step: "any" }),
          list("spec.advanced.precheck.env", "Precheck environment variables", () => ({ name: "", value: "" }), envRow)]) : "",
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
      for (let e = at; e; e = e.parentElement?.closest("[data-path]")) around.push(e.getAttribute("data-path"));
      if (!attempted && !touched.has(dotted(p.path)) && !around.some((x) => touched.has(x))) continue;
      shown.push(p);
      (at || form).append(h("div", { class: `field-problem ${p.severity}`, role: "alert", "data-for": p.path }, p.message));
    }
    const pending = data.problems.length - shown.length;
    problems.replaceChildren(...shown.map((p) => h("li", { class: p.severity, "data-path": p.path }, h("code", {}, p.path || "(document)"), ` ${p.message}`)),
      pending ? h("li", { class: "muted", id: "problems-pending" }, `${pending} problem${pending === 1 ? "" : "s"} left; each shows at its field once you edit it or press Create.`) : "");
    const c = doc.spec.compute;
    const lines = (quota || []).filter((q) => q.group === doc.metadata.projectGroup && q.pool === c.pool && q.resourceType === c.resourceType && (c.instanceSpecs || []).some((s) => s.spec === q.spec));
    // The quota table scrolls sideways in a box of its own (focusable, so a keyboard scrolls it too) when its
    // columns do not fit the panel: on a phone, or beside the form with long spec names.
    const quotaTable = () => h("div", { class: "table-wrap quota-wrap", id: "quota-wrap", role: "region", "aria-labelledby": "quota-title", tabindex: "0" },
      h("table", { class: "quota", id: "quota" }, h("caption", { id: "quota-title", class: "visually-hidden" }, "Quota lines"),
        h("thead", {}, h("tr", {}, ["Spec", "Quota", "Remaining", "Pool available", "Idle", "Unreserved"].map((x) => h("th", { scope: "col" }, x)))),
        h("tbody", {}, lines.map((q) => h("tr", {}, h("td", { class: "spec-name" }, q.spec), h("td", {}, q.limit), h("td", {}, q.remaining), h("td", {}, q.poolAvailable), h("td", {}, q.idle), h("td", {}, q.unreserved))))));
    summary.replaceChildren(
      h("h2", {}, "Demand and quota"),
      ...(data.demand || []).map((d) => h("p", { class: "demand" }, h("strong", {}, `Option ${d.option + 1}: `),
        d.roles.map((r) => `${r.role} ${r.replicas} × ${r.spec} (${r.countPerNode} per replica)`).join("; "),
        ` — ${d.replicas} replica${d.replicas === 1 ? "" : "s"}, ${d.total.gpus} GPUs, ${d.total.vcpus} vCPU, ${d.total.memoryMib} MiB`)),
      lines.length ? quotaTable() : h("p", { class: "muted" }, "No quota lines for this group, pool, resource type and specs."),
      ...(data.fragmentation || []).map((f) => h("p", { class: "muted fragmentation" }, `${f.spec}: ${f.replicasFit} replicas of this size fit now on ${f.nodesWithRoom} nodes; free blocks `,
        Object.entries(f.freeUnits).map(([units, nodes]) => `${units} unit${units === "1" ? "" : "s"} × ${nodes} node${nodes === 1 ? "" : "s"}`).join(", ") || "none")),
      data.admission ? h("p", { id: "admission", class: data.admission.now ? "ok" : "warn" }, data.admission.now ? "✓ " : h("strong", {}, "Would wait: "), data.admission.reason) : h("p", { class: "muted" }, "Fix the problems to see whether it would be admitted."),
    );
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = /** @type {HTMLButtonElement} */ (document.getElementById("create-submit"));
    attempted = true;
    button.disabled = true;
    try {
      const { data } = await api("POST", "/api/v1/tasks", JSON.stringify(toDoc()), { "Idempotency-Key": key, "Content-Type": "application/json" });
      location.hash = `#/tasks/${encodeURIComponent(data.name)}`;
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
