// @ts-check
// The catalog editor on the admin page: a form section per kind of entry (regions, clusters, instance specs,
// pools, nodes, project groups with their quota lines, images and registries, volumes, datasets, models,
// labels), over a copy of the whole catalog as GET /api/v1/catalog answers it. Each control writes only its
// own key of that copy, so whatever the form does not show (a node's GPU devices, its cordon, fields of a
// newer server) goes back unchanged. Saving PUTs the copy; the server's refusals are shown where they belong:
// conflicts with active tasks (409) with a second, deliberate "save anyway", inconsistencies (400, one line
// per entry) at the entries they name. The raw text stays one toggle away.

// The editor is in five modules: this one holds its state and its save; catalog-model.js the pure parts (kinds,
// differences, where the server's messages point); catalog-fields.js the controls; catalog-entries.js the form's
// sections and entries; catalog-answers.js how the server's refusals are shown.

import { api, h } from "./core.js";
import { serverAnswers } from "./catalog-answers.js";
import { catalogForm } from "./catalog-entries.js";
import { canon, changes, copy, locate } from "./catalog-model.js";

export { changes };

// Whether the editor last shown holds unsaved changes: leaving or reloading the page asks first. One listener
// for the page's life, however often the admin page is drawn.
let shown = () => false;
window.addEventListener("beforeunload", (e) => {
  if (shown()) { e.preventDefault(); e.returnValue = ""; }
});

/// The editor. `saved(catalog)` is called with what the server answered after a save; `say(text, bad)`
/// writes the page's status line.
export function catalogEditor({ saved, say }) {
  /** @type {import("./catalog-model.js").EditorState} */
  const st = { base: null, draft: null, asText: false, open: new Set(["regions"]), bad: new Map(), refused: null };

  const form = h("div", { id: "catalog-form" });
  const text = h("textarea", { id: "catalog", rows: 22, spellcheck: "false", "aria-label": "catalog (JSON or YAML)", hidden: true,
    oninput: () => { clearRefusal(); status(); } });
  const problems = h("div", { id: "catalog-problems", role: "alert" });
  const conflicts = h("div", { id: "catalog-conflicts", "aria-live": "polite" });
  // Not a live region: it changes at every keystroke; saves and refusals are announced by the page's status line.
  const pending = h("p", { id: "catalog-changes", class: "muted" });
  const toggle = h("button", { type: "button", id: "catalog-as-text", class: "link", "aria-expanded": "false", "aria-controls": "catalog", onclick: () => setMode(!st.asText) },
    "Advanced: edit as JSON/YAML");
  const saveButton = h("button", { type: "button", id: "save-catalog", onclick: () => save(false) }, "Save catalog");
  const discard = h("button", { type: "button", id: "discard-catalog", class: "secondary", onclick: () => {
    if (!confirm("Discard your changes to the catalog?")) return;
    load(st.base, true);
    say("changes discarded");
  } }, "Discard changes");

  const dirty = () => (st.asText ? text.value.trim() !== JSON.stringify(st.base, null, 2).trim() : canon(st.draft) !== canon(st.base));

  function status() {
    if (!st.base) return;
    const d = dirty();
    if (st.asText) pending.textContent = d ? "The text differs from the catalog in force." : "No unsaved changes.";
    else {
      const c = d ? changes(st.base, st.draft) : [];
      pending.textContent = d ? `Unsaved: ${c.slice(0, 6).join(", ")}${c.length > 6 ? `, and ${c.length - 6} more` : ""}.` : "No unsaved changes.";
    }
    discard.disabled = !d;
  }

  // Any edit: the draft moved away from what the server refused, so "save anyway" would force something else.
  function edited() { clearRefusal(); status(); }
  function clearRefusal() {
    if (st.refused !== null) { st.refused = null; conflicts.replaceChildren(); }
  }

  // ---- the form, and the server's answers ---------------------------------------------------------------------

  /** @type {import("./catalog-model.js").Editor} */
  const ed = { st, edited, render, say };
  const { sections } = catalogForm(ed);
  const { showProblems, showConflicts } = serverAnswers({ st, form, problems, conflicts, saveButton, clearRefusal, save });

  function render() {
    if (st.asText || !st.draft) return;
    const focused = document.activeElement?.id;
    const y = window.scrollY;
    form.replaceChildren(...sections());
    if (focused) document.getElementById(focused)?.focus({ preventScroll: true });
    window.scrollTo(0, y);
    status();
  }

  function setMode(text_) {
    if (text_ === st.asText) return;
    if (text_) {
      text.value = JSON.stringify(st.draft, null, 2);
    } else {
      let parsed;
      try { parsed = JSON.parse(text.value); } catch {
        if (text.value.trim() !== JSON.stringify(st.draft, null, 2).trim()
          && !confirm("The form reads JSON only, and this text is not JSON (YAML, perhaps). Save it first to keep it. Back to the form without it?")) return;
        parsed = st.draft;
      }
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) { say("the catalog is a JSON object; fix the text first", true); return; }
      st.draft = parsed;
    }
    st.asText = text_;
    text.hidden = !st.asText;
    form.hidden = st.asText;
    toggle.textContent = st.asText ? "Back to the form" : "Advanced: edit as JSON/YAML";
    toggle.setAttribute("aria-expanded", String(st.asText));
    clearRefusal();
    render();
    status();
    (st.asText ? text : toggle).focus();
  }

  async function save(force) {
    const body = force ? st.refused : st.asText ? text.value : JSON.stringify(st.draft);
    if (body === null) return;
    showProblems("", []);
    if (!force) {
      clearRefusal();
      if (!st.asText && st.bad.size) {
        showProblems("Fix these first", [...st.bad.values()].map((b) => ({ text: `${b.where}, ${b.text}`, path: b.path, inline: false })));
        return;
      }
      if (!dirty() && !confirm("Nothing changed. Save the same catalog again?")) return;
      try {
        // Someone else (another admin, a node action on this page) changed it since it was read.
        const { data: now } = await api("GET", "/api/v1/catalog");
        if (canon(now) !== canon(st.base)
          && !confirm(`The catalog in force changed since you began (${changes(st.base, now).slice(0, 4).join(", ") || "details"}). Save yours over it?`)) return;
      } catch (e) { say(e.message, true); return; }
      const what = st.asText ? "the text as the catalog" : changes(st.base, st.draft).join(", ") || "the catalog unchanged";
      if (!confirm(`Replace the catalog? ${what}.`)) return;
    }
    saveButton.disabled = true;
    try {
      const { data } = await api("PUT", `/api/v1/admin/catalog${force ? "?force=true" : ""}`, body);
      clearRefusal();
      load(data, true);
      if (st.asText) text.value = JSON.stringify(data, null, 2);
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
        const cat = st.asText ? (() => { try { return JSON.parse(text.value); } catch { return {}; } })() : st.draft;
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
    const keep = st.base && st.draft && !reset && dirty();
    if (keep) {
      const nodeStates = (into) => {
        for (const [n, node] of Object.entries(cat.nodes || {})) {
          const d = into.nodes?.[n];
          if (d) for (const k of ["schedulable", "failed"]) { if (k in node) d[k] = node[k]; else delete d[k]; }
        }
      };
      nodeStates(st.draft);
      nodeStates(st.base);
    } else {
      st.base = copy(cat);
      st.draft = copy(cat);
      st.bad.clear();
      if (st.asText) text.value = JSON.stringify(cat, null, 2);
    }
    render();
    status();
  }

  shown = () => form.isConnected && st.base !== null && dirty();

  // The save bar stays in view at the top while the form scrolls under it; what a save refused shows below it.
  const element = h("div", { class: "catalog-editor" },
    h("p", { class: "muted" }, "Changes are a draft until you save; the server checks the whole catalog, and refuses one that takes away what active tasks use. ", toggle),
    h("div", { class: "save-bar" }, pending, h("div", { class: "actions" }, discard, saveButton)),
    problems, conflicts, form, text);
  return { element, load, dirty };
}
