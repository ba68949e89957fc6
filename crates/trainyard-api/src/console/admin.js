// @ts-check
// The admin page: nodes, quotas, the catalog (a form per kind of entry, or its text), who may use what, the
// image cache, users and their tokens, project groups and TaskEnv.

import { api, h, moment, repeat, show } from "./core.js";
import { tokenPanel } from "./account.js";
import { catalogEditor } from "./catalog.js";

// A table that scrolls sideways on its own when it is wider than the screen, instead of the page.
const wide = (table) => h("div", { class: "table-wrap" }, table);

/// `me`: the signed-in admin (whoami), so that revoking their own session's token signs them out.
export async function adminPage(me) {
  const msg = h("p", { role: "status", "aria-live": "polite", id: "admin-msg" });
  const say = (text, bad) => { msg.textContent = text; msg.className = bad ? "error" : "ok"; };
  const nodes = h("tbody", { id: "nodes" });
  const quota = h("tbody", { id: "quota-lines" });
  const editor = catalogEditor({ say, saved: () => load(false) });
  const users = h("tbody", { id: "users" });
  const owners = h("tbody", { id: "catalog-groups" });
  const cached = h("tbody", { id: "cached-images" });
  const cacheTotal = h("span", { id: "cache-total", class: "muted" });
  const logins = h("tbody", { id: "registry-logins" });
  const login = { host: h("input", { id: "login-host", placeholder: "registry.example:5000", spellcheck: "false" }),
    username: h("input", { id: "login-user", spellcheck: "false" }),
    password: h("input", { id: "login-password", type: "password", autocomplete: "new-password" }),
    groups: h("input", { id: "login-groups", placeholder: "none: the catalog's presets only", spellcheck: "false" }) };
  const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
  async function loadImages() {
    try {
      const { data } = await api("GET", "/api/v1/admin/images");
      cached.replaceChildren(...data.items.map((x) => h("tr", { "data-digest": x.digest },
        h("td", { class: "mono", title: x.digest }, x.digest.slice(0, 19)), h("td", { class: "mono" }, x.references.join(", ")),
        h("td", {}, mib(x.bytes)), h("td", {}, moment(x.lastUsedMs)))));
      if (!data.items.length) cached.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No registry images are cached on this machine.")));
      cacheTotal.textContent = `${data.items.length} image${data.items.length === 1 ? "" : "s"}, ${mib(data.items.reduce((a, x) => a + x.bytes, 0))}`;
      const l = await api("GET", "/api/v1/admin/registries");
      logins.replaceChildren(...l.data.items.map((x) => h("tr", { "data-host": x.host },
        h("td", { class: "mono" }, x.host), h("td", {}, x.username), h("td", {}, (x.projectGroups || []).join(", ") || "presets only"), h("td", {}, moment(x.updatedAtMs)),
        h("td", {}, h("button", { type: "button", class: "link", "aria-label": `remove the login of ${x.host}`, onclick: async () => {
          if (!confirm(`Remove the login of ${x.host}?`)) return;
          try { await api("DELETE", `/api/v1/admin/registries/${encodeURIComponent(x.host)}/login`); say(`login of ${x.host} removed`); loadImages(); } catch (e) { say(e.message, true); }
        } }, "Remove")))));
    } catch (e) { say(e.message, true); }
  }
  const groups = h("tbody", { id: "project-groups" });
  let cat = null;

  // Users (name, role, groups) and the project groups with their members, from the same list.
  async function loadUsers() {
    const { data } = await api("GET", "/api/v1/admin/users");
    // Disabling refuses every token of the user (within seconds on every server); deleting removes them and
    // retires the name. Either way their tasks stay, and the admin chooses what becomes of their work (the
    // API's default: queued tasks held, running ones stopped) in a form under the user's row.
    const enable = (u) => async () => {
      try {
        await api("POST", `/api/v1/admin/users/${encodeURIComponent(u.name)}/enable`);
        say(`user ${u.name} enabled`);
        await loadUsers();
      } catch (e) { say(e.message, true); }
    };
    const choose = (u, action) => () => {
      users.querySelector("tr.account-choice")?.remove();
      const queued = h("select", { name: "queued", "aria-label": "their queued tasks" },
        h("option", { value: "hold" }, "hold their queued tasks until enabled"),
        h("option", { value: "stop" }, "stop their queued tasks"),
        h("option", { value: "keep" }, "leave their queued tasks queued"));
      const running = h("select", { name: "running", "aria-label": "their running tasks" },
        h("option", { value: "stop" }, "stop their running tasks (exit checkpoint first)"),
        h("option", { value: "keep" }, "leave their running tasks running"));
      const what = action === "delete"
        ? `Delete ${u.name}? Their tokens are removed and the name is retired; their tasks stay for the record.`
        : `Disable ${u.name}? Every token of theirs is refused until enabled again; their tasks stay.`;
      const row = h("tr", { class: "account-choice", "data-choice-for": u.name }, h("td", { colspan: 5 },
        h("form", { onsubmit: async (ev) => {
          ev.preventDefault();
          try {
            await api("POST", `/api/v1/admin/users/${encodeURIComponent(u.name)}/${action}`,
              JSON.stringify({ queued: queued.value, running: running.value }), { "Content-Type": "application/json" });
            say(`user ${u.name} ${action === "delete" ? "deleted" : "disabled"}; queued tasks: ${queued.value}, running tasks: ${running.value}`);
            await loadUsers();
          } catch (e) { say(e.message, true); }
        } },
        h("p", {}, what), queued, " ", running, " ",
        h("button", { type: "submit", class: "danger", "data-action": `confirm-${action}` }, action === "delete" ? "Delete" : "Disable"), " ",
        h("button", { type: "button", class: "link", onclick: () => row.remove() }, "Cancel"))));
      users.querySelector(`tr[data-user="${CSS.escape(u.name)}"]`)?.after(row);
      queued.focus();
    };
    users.replaceChildren(...data.items.map((u) => h("tr", { "data-user": u.name, "data-disabled": String(!!u.disabled) },
      h("td", {}, u.name), h("td", { "data-label": "Role" }, u.role), h("td", { "data-label": "Project groups" }, u.groups.join(", ") || h("span", { class: "muted" }, "none")),
      h("td", { "data-label": "State" }, h("span", { class: `badge ${u.disabled ? "failed" : "succeeded"}` }, u.deleted ? "deleted" : u.disabled ? "disabled" : "active")),
      h("td", {}, h("button", { type: "button", class: "link", "aria-label": `edit ${u.name}`, onclick: () => {
        user.name.value = u.name; user.role.value = u.role; user.groups.value = u.groups.join(", "); user.name.focus();
      } }, "Edit"), " ",
      h("button", { type: "button", class: "link", "aria-label": `tokens of ${u.name}`, onclick: () => loadTokens(u.name) }, "Tokens"), " ",
      u.deleted
        ? h("span", { class: "muted" }, "name retired")
        : u.disabled
        ? h("button", { type: "button", "data-action": "enable", "aria-label": `enable ${u.name}`, onclick: enable(u) }, "Enable")
        : h("button", { type: "button", class: "danger", "data-action": "disable", "aria-label": `disable ${u.name}`, onclick: choose(u, "disable") }, "Disable"),
      u.deleted || u.name === me?.name ? "" : " ",
      u.deleted || u.name === me?.name ? "" : h("button", { type: "button", class: "danger", "data-action": "delete", "aria-label": `delete ${u.name}`, onclick: choose(u, "delete") }, "Delete")))));
    const names = [...new Set([...Object.keys(cat?.projectGroups || {}), ...data.items.flatMap((u) => u.groups)])].sort();
    groups.replaceChildren(...names.map((g) => {
      const members = data.items.filter((u) => u.groups.includes(g)).map((u) => u.name);
      const known = g in (cat?.projectGroups || {});
      const lines = (q?.items || []).filter((l) => l.group === g);
      return h("tr", { "data-group": g },
        h("td", {}, g, known ? "" : h("span", { class: "muted" }, " (not in the catalog)")),
        h("td", { class: "members" }, members.join(", ") || h("span", { class: "muted" }, "no members")),
        h("td", {}, lines.length ? lines.map((l) => h("span", { class: "label" }, `${l.resourceType} ${l.spec}: ${l.limit - l.remaining}/${l.limit}`)) : h("span", { class: "muted" }, "no quota")));
    }));
  }
  let q = null;
  const drawQuota = () => quota.replaceChildren(...q.items.map((l) => h("tr", {},
    [l.group, l.resourceType, l.pool, l.spec, l.limit, l.limit - l.remaining, l.remaining, l.poolAvailable, l.idle].map((v) => h("td", {}, v)))));

  // A user's tokens by id (never the token itself): when made and last used, Revoke, and a labelled create.
  const tokens = tokenPanel({ me: me?.name, say });
  async function loadTokens(name) {
    await tokens.load(name);
    tokens.element.scrollIntoView({ block: "nearest" });
  }

  // `everything`: the image cache and registry logins too (a catalog save or a node action leaves them).
  async function load(everything = true) {
    ({ data: cat } = await api("GET", "/api/v1/catalog"));
    ({ data: q } = await api("GET", "/api/v1/quota"));
    editor.load(cat);
    nodes.replaceChildren(...Object.entries(cat.nodes).map(([name, n]) => {
      const state = n.failed ? "failed" : n.schedulable === false ? "cordoned" : "healthy";
      const put = (body, what) => async () => {
        if (!confirm(`${what} node ${name}?`)) return;
        try {
          await api("PUT", `/api/v1/admin/nodes/${encodeURIComponent(name)}`, JSON.stringify(body), { "Content-Type": "application/json" });
          say(`node ${name}: ${what.toLowerCase()} done`);
          load(false);
        } catch (e) { say(e.message, true); }
      };
      return h("tr", { "data-node": name },
        h("td", {}, name), h("td", { "data-label": "Pool" }, n.pool), h("td", { "data-label": "Capacity" }, `${n.gpus ? `${n.gpus} × ${n.gpuModel}, ` : ""}${n.vcpus} vCPU, ${n.memoryMib} MiB`),
        h("td", { "data-label": "Health" }, h("span", { class: `badge ${state === "healthy" ? "succeeded" : state === "failed" ? "failed" : "queued"}`, "data-state": state }, state)),
        h("td", {},
          n.schedulable === false ? h("button", { type: "button", onclick: put({ schedulable: true }, "Uncordon") }, "Uncordon") : h("button", { type: "button", onclick: put({ schedulable: false }, "Cordon") }, "Cordon"), " ",
          n.failed ? h("button", { type: "button", onclick: put({ failed: false }, "Repair") }, "Repair") : h("button", { type: "button", class: "danger", "data-action": "fail", onclick: put({ failed: true }, "Mark failed") }, "Mark failed")));
    }));
    // Which project groups may use each image, volume, dataset and model (catalog `projectGroups`).
    const kinds = [["image", cat.images], ["volume", cat.volumes], ["dataset", cat.datasets], ["model", cat.models]];
    owners.replaceChildren(...kinds.flatMap(([kind, m]) => Object.entries(m || {}).map(([name, x]) => {
      const groups = x.projectGroups || [];
      const who = kind === "image" && name === "host"
        ? `admins${groups.length ? `, and ${groups.join(", ")}` : " only"}`
        : groups.length ? groups.join(", ") : "every group";
      return h("tr", { "data-entry": `${kind}/${name}` }, h("td", {}, kind), h("td", { class: "mono" }, name), h("td", {}, who));
    })));
    drawQuota();
    await loadUsers();
    if (everything) await loadImages();
  }

  const user = {
    name: h("input", { id: "user-name", spellcheck: "false", autocomplete: "off" }),
    role: h("select", { id: "user-role" }, h("option", {}, "member"), h("option", {}, "admin")),
    groups: h("input", { id: "user-groups", placeholder: "group-a, group-b", spellcheck: "false" }),
  };
  const envUser = h("input", { id: "env-user", placeholder: "user", spellcheck: "false" });
  const envRows = h("tbody", {});
  const envNew = { name: h("input", { id: "env-name", placeholder: "NAME", spellcheck: "false" }), value: h("input", { id: "env-value", placeholder: "value" }), hidden: h("input", { id: "env-hidden", type: "checkbox" }) };
  async function loadEnv() {
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`);
      envRows.replaceChildren(...(data.items || []).map((v) => h("tr", {}, h("td", { class: "mono" }, v.name), h("td", {}, v.hidden ? "(hidden)" : v.value),
        h("td", {}, h("button", { type: "button", class: "link", "aria-label": `remove ${v.name}`, onclick: async () => { await api("DELETE", `/api/v1/users/${encodeURIComponent(envUser.value)}/env/${encodeURIComponent(v.name)}`); loadEnv(); } }, "Remove")))));
    } catch (e) { say(e.message, true); }
  }
  const field = (label, control) => h("div", { class: "field" }, h("label", { for: control.id }, label), control);
  const head = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c || h("span", { class: "visually-hidden" }, "Actions")))));

  // The page is long: a list of its sections first (buttons, since the hash is the page's route).
  const parts = [["nodes", "Nodes"], ["quotas", "Quotas"], ["catalog", "Catalog"], ["owners", "Who may use what"], ["images", "Image cache"],
    ["users", "Users and tokens"], ["groups", "Project groups"], ["env", "TaskEnv"]];
  const part = (key, ...body) => h("section", { "aria-labelledby": `${key}-title` },
    h("h2", { id: `${key}-title`, tabindex: "-1" }, parts.find(([k]) => k === key)[1]), ...body);
  const contents = h("nav", { class: "contents", "aria-label": "sections of this page" }, parts.map(([key, title]) =>
    h("button", { type: "button", class: "link", onclick: () => { const t = document.getElementById(`${key}-title`); t.scrollIntoView({ block: "start" }); t.focus({ preventScroll: true }); } }, title)));

  show(
    h("h1", {}, "Admin"), contents, msg,
    part("nodes", wide(h("table", { "aria-labelledby": "nodes-title", class: "cards" }, head(["Node", "Pool", "Capacity", "Health", ""]), nodes))),
    part("quotas", wide(h("table", { "aria-labelledby": "quotas-title" }, head(["Group", "Type", "Pool", "Spec", "Quota", "Used", "Remaining", "Pool available", "Idle"]), quota)),
      h("p", { class: "muted" }, "Quotas are set per project group in the catalog below.")),
    part("catalog", editor.element),
    part("owners", wide(h("table", { "aria-labelledby": "owners-title" }, head(["Kind", "Name", "Project groups"]), owners)),
      h("p", { class: "muted" }, "Choose the project groups of an image, volume, dataset or model in the catalog above; with none chosen every group may use it (the host image: admins only).")),
    part("images", wide(h("table", { "aria-labelledby": "images-title" }, head(["Digest", "References", "Size", "Last used"]), cached)),
      h("div", { class: "row" }, cacheTotal,
        h("button", { type: "button", id: "prune-images", class: "danger", onclick: async () => {
          if (!confirm("Remove every cached image that no task runs?")) return;
          try {
            const { data } = await api("POST", "/api/v1/admin/images/prune");
            say(`pruned ${data.removed.length} image${data.removed.length === 1 ? "" : "s"}, ${mib(data.freedBytes)} freed`);
            loadImages();
          } catch (e) { say(e.message, true); }
        } }, "Prune unused images")),
      h("h3", { id: "logins-title" }, "Registry logins"),
      wide(h("table", { "aria-labelledby": "logins-title" }, head(["Registry", "User", "Project groups", "Set", ""]), logins)),
      h("div", { class: "row-item" }, field("Registry", login.host), field("User name", login.username), field("Password", login.password),
        field("Project groups", login.groups),
        h("button", { type: "button", id: "set-login", onclick: async () => {
          try {
            await api("PUT", `/api/v1/admin/registries/${encodeURIComponent(login.host.value.trim())}/login`,
              JSON.stringify({ username: login.username.value, password: login.password.value,
                projectGroups: login.groups.value.split(",").map((g) => g.trim()).filter(Boolean) }), { "Content-Type": "application/json" });
            say(`login of ${login.host.value.trim()} set`);
            login.password.value = "";
            loadImages();
          } catch (e) { say(e.message, true); }
        } }, "Set login")),
      h("p", { class: "muted" }, "Passwords are stored sealed and never shown again. A login serves the catalog's images of the registry (or its mirrors), each for the project groups it is offered to, and any image of it for the project groups named here.")),
    part("users", wide(h("table", { "aria-labelledby": "users-title", class: "cards" }, head(["User", "Role", "Project groups", "State", ""]), users)),
      h("h3", {}, "Add or change a user"),
      h("div", { class: "row-item" }, field("Name", user.name), field("Role", user.role), field("Project groups", user.groups),
        h("button", { type: "button", id: "save-user", onclick: async () => {
          try {
            const groups = user.groups.value.split(",").map((g) => g.trim()).filter(Boolean);
            await api("POST", "/api/v1/admin/users", JSON.stringify({ name: user.name.value, role: user.role.value, groups }), { "Content-Type": "application/json" });
            say(`user ${user.name.value} saved`);
            await loadUsers();
          } catch (e) { say(e.message, true); }
        } }, "Save user"),
        h("button", { type: "button", id: "new-token-for-user", class: "secondary", onclick: async () => {
          if (!user.name.value.trim()) { say("name the user first", true); user.name.focus(); return; }
          await loadTokens(user.name.value.trim());
          tokens.focus();
        } }, "Tokens of this user")),
      tokens.element),
    part("groups", wide(h("table", { "aria-labelledby": "groups-title" }, head(["Group", "Members", "Quota"]), groups)),
      h("p", { class: "muted" }, "Groups are in the catalog (project groups); a user's groups are set above.")),
    part("env", h("div", { class: "row-item" }, field("User", envUser), h("button", { type: "button", onclick: loadEnv }, "Show")),
      wide(h("table", { "aria-label": "TaskEnv of the user" }, h("tbody", {}, envRows))),
      h("div", { class: "row-item" }, field("Variable", envNew.name), field("Value", envNew.value), h("div", { class: "field check" }, envNew.hidden, h("label", { for: "env-hidden" }, "hidden")),
        h("button", { type: "button", onclick: async () => {
          try {
            await api("PUT", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`, JSON.stringify({ name: envNew.name.value, value: envNew.value.value, hidden: envNew.hidden.checked }), { "Content-Type": "application/json" });
            loadEnv();
          } catch (e) { say(e.message, true); }
        } }, "Set"))),
  );
  // Usage moves as tasks start and end, and the scheduler's figures follow a catalog save within a tick.
  repeat(async () => {
    try {
      ({ data: q } = await api("GET", "/api/v1/quota"));
      drawQuota();
    } catch { /* the next round tries again */ }
  }, 5000);
  await load();
}
