// @ts-check
// The catalog editor's controls, each bound to one key of one object of the draft: typing writes that key and
// nothing else, so whatever the form does not show goes back unchanged. A number that is not one stays in its
// field, marked, and in the editor's `bad` map (it holds the save back) until it is fixed or its entry goes.

import { h } from "./core.js";
import { idOf, where } from "./catalog-model.js";

/** The controls, over the editor's state and callbacks.
 * @param {import("./catalog-model.js").Editor} ed
 */
export function fieldControls(ed) {
  /** A labelled control, with its hint and what was refused in it.
   * @param {string} id @param {string} label @param {HTMLElement} control @param {string} path
   * @param {string} [hint] @param {boolean} [wide] */
  function field(id, label, control, path, hint, wide = false) {
    return h("div", { class: wide ? "field wide" : "field", "data-path": path },
      h("label", { for: id }, label), control,
      hint ? h("span", { class: "muted hint", id: `${id}-hint` }, hint) : null,
      ed.st.bad.has(id) ? h("span", { class: "field-problem", id: `${id}-problem` }, ed.st.bad.get(id).text) : null);
  }

  // `wide`: a reference or a path, given two columns where there are.
  /**
   * @param {Record<string, any>} obj the object of the draft the control writes
   * @param {string} key its key there
   * @param {string} label
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {{ optional?: boolean, placeholder?: string, hint?: string, wide?: boolean }} [opts]
   */
  function textField(obj, key, label, path, { optional = true, placeholder, hint, wide = false } = {}) {
    const id = idOf(path);
    const input = h("input", { id, value: obj[key] ?? "", placeholder, spellcheck: "false", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.trim();
        if (v === "" && optional) delete obj[key]; else obj[key] = v;
        ed.edited();
      } });
    return field(id, label, input, path, hint, wide);
  }

  /**
   * @param {Record<string, any>} obj the object of the draft the control writes
   * @param {string} key its key there
   * @param {string} label
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {{ min?: number, hint?: string }} [opts]
   */
  function numberField(obj, key, label, path, { min = 0, hint } = {}) {
    const id = idOf(path);
    // What was typed and refused stays in the field when the form is drawn again (it never reached the draft).
    const input = h("input", { id, type: "number", inputmode: "numeric", min, step: 1, value: ed.st.bad.has(id) ? ed.st.bad.get(id).raw : obj[key] ?? "", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.trim();
        const wrap = input.closest(".field");
        wrap.querySelector(".field-problem")?.remove();
        if (/^\d+$/.test(v) && Number(v) >= min) {
          obj[key] = Number(v);
          ed.st.bad.delete(id);
          input.removeAttribute("aria-invalid");
          input.setAttribute("aria-describedby", hint ? `${id}-hint` : "");
        } else {
          ed.st.bad.set(id, { text: `${label}: a whole number${min ? ` of at least ${min}` : ""}`, path, where: where(path, obj), raw: input.value });
          input.setAttribute("aria-invalid", "true");
          input.setAttribute("aria-describedby", `${hint ? `${id}-hint ` : ""}${id}-problem`);
          wrap.append(h("span", { class: "field-problem", id: `${id}-problem` }, ed.st.bad.get(id).text));
        }
        ed.edited();
      } });
    if (ed.st.bad.has(id)) {
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", `${hint ? `${id}-hint ` : ""}${id}-problem`);
    }
    return field(id, label, input, path, hint);
  }

  /**
   * @param {Record<string, any>} obj the object of the draft the control writes
   * @param {string} key its key there
   * @param {string} label
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {{ then?: boolean }} [opts]
   */
  function checkField(obj, key, label, path, { then } = {}) {
    const id = idOf(path);
    return h("div", { class: "field check", "data-path": path },
      h("input", { id, type: "checkbox", checked: !!obj[key], "data-field": key,
        onchange: (e) => { obj[key] = e.target.checked; ed.edited(); if (then) ed.render(); } }),
      h("label", { for: id }, label));
  }

  // `redraw`: other controls depend on this choice (a spec's kind, a quota line's pool).
  // `after`: what else follows from the choice (a CPU spec has no GPUs).
  /**
   * @param {Record<string, any>} obj the object of the draft the control writes
   * @param {string} key its key there
   * @param {string} label
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {string[]} options
   * @param {{ redraw?: boolean, after?: () => void, missing?: string }} [opts]
   */
  function selectField(obj, key, label, path, options, { redraw = false, after, missing = "not in the catalog" } = {}) {
    const id = idOf(path);
    const current = obj[key] ?? "";
    const all = options.includes(current) ? options : [current, ...options];
    const sel = h("select", { id, "data-field": key, onchange: () => { obj[key] = sel.value; after?.(); ed.edited(); if (redraw) ed.render(); } },
      all.map((o) => h("option", { value: o, selected: o === current }, o === "" ? "(choose)" : options.includes(o) ? o : `${o} (${missing})`)));
    return field(id, label, sel, path);
  }

  // A list of names chosen from a set (a pool's instance specs, an entry's clusters or project groups).
  /**
   * @param {Record<string, any>} obj the object of the draft the boxes write
   * @param {string} key its key there
   * @param {string} legend
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {string[]} options
   * @param {string | null} emptyMeans what choosing none means, said under the boxes
   * @param {{ redraw?: boolean }} [opts]
   */
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
            ed.edited();
            if (redraw) ed.render();
          } }),
        h("label", { for: id }, options.includes(o) ? o : `${o} (not in the catalog)`));
    });
    return h("fieldset", { class: "picks", "data-path": path },
      h("legend", {}, legend),
      boxes.length ? boxes : h("span", { class: "muted" }, "none in the catalog yet"),
      emptyMeans ? h("span", { class: "muted hint" }, `None chosen: ${emptyMeans}.`) : null);
  }

  // A list of words typed comma-separated (a registry's mirrors, a label's allowed values).
  /**
   * @param {Record<string, any>} obj the object of the draft the control writes
   * @param {string} key its key there
   * @param {string} label
   * @param {string} path where that is in the catalog (`pools.gpu.cluster`): the control's id and data-path
   * @param {{ hint?: string, optional?: boolean }} [opts]
   */
  function listField(obj, key, label, path, { hint, optional = false } = {}) {
    const id = idOf(path);
    const input = h("input", { id, value: (obj[key] || []).join(", "), spellcheck: "false", "data-field": key,
      "aria-describedby": hint ? `${id}-hint` : undefined,
      oninput: () => {
        const v = input.value.split(",").map((x) => x.trim()).filter(Boolean);
        if (!v.length && optional) delete obj[key]; else obj[key] = v;
        ed.edited();
      } });
    return field(id, label, input, path, hint);
  }

  return { field, textField, numberField, checkField, selectField, pickField, listField };
}
