// @ts-check
// The account page (every user): who you are, and your API tokens: listed by id with when each was made and
// last used, made with a label (the token is shown once), revoked. The token panel is shared with the admin
// page, where admins manage anyone's.

import { api, h, moment, show, TOKEN_KEY } from "./core.js";
import { whoami } from "./signin.js";

/// Signs this browser out: forgets the token, clears the header and goes to sign-in.
async function signOut() {
  localStorage.removeItem(TOKEN_KEY);
  await whoami();
  location.hash = "#/signin";
}

/// A user's tokens: a table (`#tokens`, a row per token with Revoke), a labelled create, and the new token
/// shown once (`#new-token`). `me` is the signed-in user's name: revoking the token this browser uses signs
/// out. `say(text, bad)` writes the page's status line.
export function tokenPanel({ me, say }) {
  let name = null;
  const title = h("h3", { id: "tokens-title" });
  const rows = h("tbody", { id: "tokens" });
  const table = h("div", { class: "table-wrap" }, h("table", { "aria-labelledby": "tokens-title", class: "cards" },
    h("thead", {}, h("tr", {}, ["Token id", "Label", "Created", "Last used", ""].map((c, i) => h("th", { scope: "col" }, i === 4 ? h("span", { class: "visually-hidden" }, "Actions") : c)))),
    rows));
  const label = h("input", { id: "token-label", maxlength: 200, placeholder: "laptop, CI, notebook", autocomplete: "off",
    onkeydown: (e) => { if (e.key === "Enter") { e.preventDefault(); create(); } } });
  const made = h("div", { id: "new-token", "aria-live": "polite" });
  const createRow = h("div", { class: "row-item token-create" },
    h("div", { class: "field" }, h("label", { for: "token-label" }, "Label of a new token"), label),
    h("button", { type: "button", id: "create-token", onclick: () => create() }, "Create token"));
  const element = h("div", { class: "token-panel", hidden: true }, title, table, createRow, made);

  async function load(who) {
    if (who !== name) made.replaceChildren();
    name = who;
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(name)}/tokens`);
      element.hidden = false;
      title.textContent = name === me ? "Your tokens" : `Tokens of ${name}`;
      const items = [...data.items].sort((a, b) => b.createdAtMs - a.createdAtMs);
      rows.replaceChildren(...items.map((t) => h("tr", { "data-token": t.id, "data-current": String(t.current) },
        h("td", { class: "mono" }, t.id, t.current ? h("span", { class: "badge running current-token" }, "this session") : null),
        h("td", { "data-label": "Label" }, t.label || h("span", { class: "muted" }, "no label")),
        h("td", { "data-label": "Created" }, moment(t.createdAtMs)),
        h("td", { "data-label": "Last used" }, t.lastUsedAtMs ? moment(t.lastUsedAtMs) : h("span", { class: "muted" }, "never")),
        h("td", {}, h("button", { type: "button", class: "danger", "data-action": "revoke", "aria-label": `revoke token ${t.id}${t.label ? ` (${t.label})` : ""}`,
          onclick: () => revoke(t) }, "Revoke")))));
      if (!items.length) rows.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "muted" }, `${name === me ? "You have" : `${name} has`} no tokens.`)));
    } catch (e) { say(e.message, true); }
  }

  async function revoke(t) {
    const own = t.current && name === me;
    const question = own
      ? `Revoke token ${t.id}? It is the one this browser is signed in with: you will be signed out.`
      : `Revoke token ${t.id}${t.label ? ` (${t.label})` : ""}${name === me ? "" : ` of ${name}`}? Whatever uses it is refused from then on.`;
    if (!confirm(question)) return;
    try {
      await api("DELETE", `/api/v1/users/${encodeURIComponent(name)}/tokens/${encodeURIComponent(t.id)}`);
      if (own) { await signOut(); return; }
      say(`token ${t.id}${name === me ? "" : ` of ${name}`} revoked`);
      if (made.querySelector(`[data-token="${CSS.escape(t.id)}"]`)) made.replaceChildren();
      await load(name);
    } catch (e) { say(e.message, true); }
  }

  async function create() {
    try {
      const { data } = await api("POST", `/api/v1/users/${encodeURIComponent(name)}/tokens`,
        JSON.stringify({ label: label.value.trim() }), { "Content-Type": "application/json" });
      label.value = "";
      const value = h("input", { id: "new-token-value", class: "mono", readonly: true, value: data.token, "aria-label": "the new token", spellcheck: "false" });
      const copied = h("span", { class: "muted", "aria-live": "polite" });
      made.replaceChildren(h("div", { class: "new-token", "data-token": data.id, role: "status" },
        h("p", {}, h("strong", {}, `New token ${data.id}${data.label ? ` (${data.label})` : ""}${name === me ? "" : ` for ${name}`}. `),
          "Copy it now: it is not shown again (only its id is listed)."),
        h("div", { class: "copy-row" }, value,
          h("button", { type: "button", id: "copy-token", onclick: async () => {
            value.select();
            try { await navigator.clipboard.writeText(data.token); copied.textContent = "copied"; } catch {
              // No clipboard API outside a secure context: the selected text is copied the old way.
              copied.textContent = document.execCommand("copy") ? "copied" : "selected: copy it with Ctrl+C";
            }
          } }, "Copy"), copied),
        h("button", { type: "button", class: "link", onclick: () => made.replaceChildren() }, "I have copied it, hide it")));
      value.focus();
      value.select();
      await load(name);
    } catch (e) { say(e.message, true); }
  }

  return { element, load, focus: () => label.focus() };
}

/// `me`: the signed-in user (whoami), read again when not given.
export async function accountPage(me) {
  if (!me) ({ data: me } = await api("GET", "/api/v1/whoami"));
  const msg = h("p", { role: "status", "aria-live": "polite", id: "account-msg" });
  const say = (text, bad) => { msg.textContent = text; msg.className = bad ? "error" : "ok"; };
  const tokens = tokenPanel({ me: me.name, say });
  show(
    h("h1", {}, "Account"),
    h("dl", { class: "overview", id: "account" },
      h("dt", {}, "Name"), h("dd", { id: "account-name" }, me.name),
      h("dt", {}, "Role"), h("dd", {}, me.role),
      h("dt", {}, "Project groups"), h("dd", {}, me.groups.join(", ") || h("span", { class: "muted" }, "none"))),
    h("section", {}, h("h2", {}, "API tokens"),
      h("p", { class: "muted" }, "A token signs in this console, the CLI (", h("code", {}, "TRAINYARD_TOKEN"), ") and the API (",
        h("code", {}, "Authorization: Bearer …"), "). Each is shown once, when made; here they are listed by id. Revoke one you no longer use or may have leaked."),
      msg, tokens.element),
  );
  await tokens.load(me.name);
}
