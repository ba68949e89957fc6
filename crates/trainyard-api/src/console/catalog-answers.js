// @ts-check
// The catalog editor's answers from the server, shown where they belong: problems (the editor's own, a 422's,
// a 400's inconsistency lines) at the fields and entries their paths name and in a list that links to them;
// conflicts with active tasks (409) with a second, deliberate "save anyway".

import { h } from "./core.js";
import { plural } from "./catalog-model.js";

/** A problem to show: its text, the path it is at (if known), and whether it also goes beside that field.
 * @typedef {{ text: string, path?: string, inline?: boolean }} Problem */

/**
 * @param {object} parts
 * @param {import("./catalog-model.js").EditorState} parts.st
 * @param {HTMLElement} parts.form the form, where problems are placed by their paths
 * @param {HTMLElement} parts.problems where the list of problems goes
 * @param {HTMLElement} parts.conflicts where a 409's conflicts go
 * @param {HTMLButtonElement} parts.saveButton
 * @param {() => void} parts.clearRefusal
 * @param {(force: boolean) => void} parts.save
 */
export function serverAnswers({ st, form, problems, conflicts, saveButton, clearRefusal, save }) {
  // Where a problem belongs: an element whose data-path is the problem's path or the longest prefix of it.
  function placeFor(path) {
    const dotted = path.replace(/\[(\d+)\]/g, "[$1]");
    for (let p = dotted; p; p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "") {
      const el = /** @type {HTMLElement | null} */ (form.querySelector(`[data-path="${CSS.escape(p)}"]`));
      if (el) return el;
    }
    return null;
  }

  /** @param {string} title @param {Problem[]} items */
  function showProblems(title, items) {
    form.querySelectorAll(".server-problem").forEach((e) => e.remove());
    if (!items.length) { problems.replaceChildren(); return; }
    const list = items.map(({ text: t, path, inline = true }) => {
      const place = path && !st.asText ? placeFor(path) : null;
      if (place && inline) {
        const where = place.matches(".entry-problems") || place.matches(".field, .quota-line, fieldset, .label-line") ? place : place.parentElement;
        where.append(h("span", { class: "field-problem server-problem", role: "note" }, t));
        const details = place.closest("details");
        if (details && !details.open) { details.open = true; st.open.add(details.dataset.kind); }
      }
      return h("li", { "data-path": path || "" }, place
        ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); place.closest("fieldset, .quota-line, .field")?.scrollIntoView({ block: "center" }); /** @type {HTMLElement | null | undefined} */ ((place.matches(".field") ? place : place.closest("fieldset"))?.querySelector("input, select, button"))?.focus(); } }, t)
        : t);
    });
    const heading = h("h4", { tabindex: "-1" }, title);
    problems.replaceChildren(h("div", { class: "problem-box" }, heading, h("ul", {}, list)));
    heading.scrollIntoView({ block: "nearest" });
  }

  /** @param {string} body what was refused: "save anyway" sends it again @param {import("./core.js").ApiError} err */
  function showConflicts(body, err) {
    const items = err.body.conflicts || [];
    const total = items.reduce((a, c) => a + c.tasks, 0);
    st.refused = body;
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
    /** @type {HTMLButtonElement} */ (conflicts.querySelector("#save-anyway")).focus();
  }

  return { showProblems, showConflicts };
}
