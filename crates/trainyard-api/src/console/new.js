// @ts-check
// A new task from a YAML or JSON document, checked by the server's validator as the user types.

import { api, h, show } from "./core.js";

export function newTask() {
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
        location.hash = `#/tasks/${encodeURIComponent(data.name)}`;
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
