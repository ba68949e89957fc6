// The admin page: nodes, quotas, labels, who may use what, the image cache, the catalog, users and tokens,
// project groups and TaskEnv.

import { api, h, show } from "./core.js";

export async function adminPage() {
  const msg = h("p", { role: "status", "aria-live": "polite", id: "admin-msg" });
  const say = (text, bad) => { msg.textContent = text; msg.className = bad ? "error" : "ok"; };
  const nodes = h("tbody", { id: "nodes" });
  const quota = h("tbody", { id: "quota-lines" });
  const catalogText = h("textarea", { id: "catalog", rows: 18, spellcheck: "false", "aria-label": "catalog (JSON or YAML)" });
  const labelSwitch = h("input", { type: "checkbox", id: "label-validation" });
  const users = h("tbody", { id: "users" });
  const owners = h("tbody", { id: "catalog-groups" });
  const cached = h("tbody", { id: "cached-images" });
  const cacheTotal = h("span", { id: "cache-total", class: "muted" });
  const logins = h("tbody", { id: "registry-logins" });
  const login = { host: h("input", { id: "login-host", "aria-label": "registry host", placeholder: "registry.example:5000", spellcheck: "false" }),
    username: h("input", { id: "login-user", "aria-label": "registry user name", spellcheck: "false" }),
    password: h("input", { id: "login-password", type: "password", "aria-label": "registry password", autocomplete: "new-password" }) };
  const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
  async function loadImages() {
    try {
      const { data } = await api("GET", "/api/v1/admin/images");
      cached.replaceChildren(...data.items.map((x) => h("tr", { "data-digest": x.digest },
        h("td", { class: "mono", title: x.digest }, x.digest.slice(0, 19)), h("td", { class: "mono" }, x.references.join(", ")),
        h("td", {}, mib(x.bytes)), h("td", {}, new Date(x.lastUsedMs).toLocaleString()))));
      if (!data.items.length) cached.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No registry images are cached on this machine.")));
      cacheTotal.textContent = `${data.items.length} image${data.items.length === 1 ? "" : "s"}, ${mib(data.items.reduce((a, x) => a + x.bytes, 0))}`;
      const l = await api("GET", "/api/v1/admin/registries");
      logins.replaceChildren(...l.data.items.map((x) => h("tr", { "data-host": x.host },
        h("td", { class: "mono" }, x.host), h("td", {}, x.username), h("td", {}, new Date(x.updatedAtMs).toLocaleString()),
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
    // Disabling refuses every token of the user (within seconds on every server); their tasks stay.
    const setDisabled = (u, off) => async () => {
      if (off && !confirm(`Disable ${u.name}? Every token of theirs is refused until enabled again.`)) return;
      try {
        await api("POST", `/api/v1/admin/users/${encodeURIComponent(u.name)}/${off ? "disable" : "enable"}`);
        say(`user ${u.name} ${off ? "disabled" : "enabled"}`);
        await loadUsers();
      } catch (e) { say(e.message, true); }
    };
    users.replaceChildren(...data.items.map((u) => h("tr", { "data-user": u.name, "data-disabled": String(!!u.disabled) },
      h("td", {}, u.name), h("td", {}, u.role), h("td", {}, u.groups.join(", ") || h("span", { class: "muted" }, "none")),
      h("td", {}, h("span", { class: `badge ${u.disabled ? "failed" : "succeeded"}` }, u.disabled ? "disabled" : "active")),
      h("td", {}, h("button", { type: "button", class: "link", "aria-label": `edit ${u.name}`, onclick: () => {
        user.name.value = u.name; user.role.value = u.role; user.groups.value = u.groups.join(", "); user.name.focus();
      } }, "Edit"), " ",
      h("button", { type: "button", class: "link", "aria-label": `tokens of ${u.name}`, onclick: () => loadTokens(u.name) }, "Tokens"), " ",
      u.disabled
        ? h("button", { type: "button", "data-action": "enable", "aria-label": `enable ${u.name}`, onclick: setDisabled(u, false) }, "Enable")
        : h("button", { type: "button", class: "danger", "data-action": "disable", "aria-label": `disable ${u.name}`, onclick: setDisabled(u, true) }, "Disable")))));
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

  // A user's tokens by id (never the token itself), each with Revoke.
  const tokensTitle = h("h3", { id: "tokens-title" });
  const tokenRows = h("tbody", { id: "tokens" });
  async function loadTokens(name) {
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(name)}/tokens`);
      tokensTitle.textContent = `Tokens of ${name}`;
      tokenRows.replaceChildren(...data.items.map((t) => h("tr", { "data-token": t.id },
        h("td", { class: "mono" }, t.id), h("td", {}, t.label || h("span", { class: "muted" }, "no label")),
        h("td", {}, new Date(t.createdAtMs).toLocaleString()),
        h("td", {}, h("button", { type: "button", class: "danger", "aria-label": `revoke token ${t.id}`, onclick: async () => {
          if (!confirm(`Revoke token ${t.id} of ${name}?`)) return;
          try {
            await api("DELETE", `/api/v1/users/${encodeURIComponent(name)}/tokens/${encodeURIComponent(t.id)}`);
            say(`token ${t.id} of ${name} revoked`);
            await loadTokens(name);
          } catch (e) { say(e.message, true); }
        } }, "Revoke")))));
    } catch (e) { say(e.message, true); }
  }

  async function load() {
    ({ data: cat } = await api("GET", "/api/v1/catalog"));
    ({ data: q } = await api("GET", "/api/v1/quota"));
    catalogText.value = JSON.stringify(cat, null, 2);
    labelSwitch.checked = !!cat.labels?.validation;
    nodes.replaceChildren(...Object.entries(cat.nodes).map(([name, n]) => {
      const state = n.failed ? "failed" : n.schedulable === false ? "cordoned" : "healthy";
      const put = (body, what) => async () => {
        if (!confirm(`${what} node ${name}?`)) return;
        try {
          await api("PUT", `/api/v1/admin/nodes/${encodeURIComponent(name)}`, JSON.stringify(body), { "Content-Type": "application/json" });
          say(`node ${name}: ${what.toLowerCase()} done`);
          load();
        } catch (e) { say(e.message, true); }
      };
      return h("tr", { "data-node": name },
        h("td", {}, name), h("td", {}, n.pool), h("td", {}, `${n.gpus ? `${n.gpus} × ${n.gpuModel}, ` : ""}${n.vcpus} vCPU, ${n.memoryMib} MiB`),
        h("td", {}, h("span", { class: `badge ${state === "healthy" ? "succeeded" : state === "failed" ? "failed" : "queued"}`, "data-state": state }, state)),
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
    quota.replaceChildren(...q.items.map((l) => h("tr", {}, [l.group, l.resourceType, l.pool, l.spec, l.limit, l.limit - l.remaining, l.remaining, l.poolAvailable, l.idle].map((v) => h("td", {}, v)))));
    await loadUsers();
    await loadImages();
  }

  async function saveCatalog(text) {
    try {
      await api("PUT", "/api/v1/admin/catalog", text);
      say("catalog saved");
      load();
    } catch (e) { say(e.message, true); }
  }
  labelSwitch.addEventListener("change", () => {
    const c = JSON.parse(JSON.stringify(cat));
    c.labels = { ...(c.labels || {}), validation: labelSwitch.checked };
    saveCatalog(JSON.stringify(c));
  });

  const user = { name: h("input", { id: "user-name", "aria-label": "user name" }), role: h("select", { id: "user-role", "aria-label": "role" }, h("option", {}, "member"), h("option", {}, "admin")), groups: h("input", { id: "user-groups", "aria-label": "project groups", placeholder: "group-a, group-b" }) };
  const tokenOut = h("pre", { id: "new-token" });
  const envUser = h("input", { id: "env-user", "aria-label": "user", placeholder: "user" });
  const envRows = h("tbody", {});
  const envNew = { name: h("input", { "aria-label": "variable name", placeholder: "NAME" }), value: h("input", { "aria-label": "value", placeholder: "value" }), hidden: h("input", { type: "checkbox", "aria-label": "hidden" }) };
  async function loadEnv() {
    try {
      const { data } = await api("GET", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`);
      envRows.replaceChildren(...(data.items || []).map((v) => h("tr", {}, h("td", { class: "mono" }, v.name), h("td", {}, v.hidden ? "(hidden)" : v.value),
        h("td", {}, h("button", { type: "button", class: "link", onclick: async () => { await api("DELETE", `/api/v1/users/${encodeURIComponent(envUser.value)}/env/${encodeURIComponent(v.name)}`); loadEnv(); } }, "Remove")))));
    } catch (e) { say(e.message, true); }
  }

  show(
    h("h1", {}, "Admin"), msg,
    h("section", {}, h("h2", {}, "Nodes"), h("table", {}, h("thead", {}, h("tr", {}, ["Node", "Pool", "Capacity", "Health", "Actions"].map((c) => h("th", { scope: "col" }, c)))), nodes)),
    h("section", {}, h("h2", {}, "Quotas and usage"), h("table", {}, h("thead", {}, h("tr", {}, ["Group", "Type", "Pool", "Spec", "Quota", "Used", "Remaining", "Pool available", "Idle"].map((c) => h("th", { scope: "col" }, c)))), quota)),
    h("section", {}, h("h2", {}, "Labels"), h("div", { class: "field check" }, labelSwitch, h("label", { for: "label-validation" }, "Tasks must use maintained labels")),
      h("p", { class: "muted" }, "Maintained labels are in the catalog below, under labels.maintained.")),
    h("section", {}, h("h2", { id: "owners-title" }, "Who may use what"),
      h("table", { "aria-labelledby": "owners-title" }, h("thead", {}, h("tr", {}, ["Kind", "Name", "Project groups"].map((c) => h("th", { scope: "col" }, c)))), owners),
      h("p", { class: "muted" }, "Set projectGroups on an image, volume, dataset or model in the catalog below; without it every group may use it (the host image: admins only).")),
    h("section", {}, h("h2", { id: "images-title" }, "Image cache"),
      h("table", { "aria-labelledby": "images-title" }, h("thead", {}, h("tr", {}, ["Digest", "References", "Size", "Last used"].map((c) => h("th", { scope: "col" }, c)))), cached),
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
      h("table", { "aria-labelledby": "logins-title" }, h("thead", {}, h("tr", {}, ["Registry", "User", "Set", ""].map((c) => h("th", { scope: "col" }, c)))), logins),
      h("div", { class: "row-item" }, login.host, login.username, login.password,
        h("button", { type: "button", id: "set-login", onclick: async () => {
          try {
            await api("PUT", `/api/v1/admin/registries/${encodeURIComponent(login.host.value.trim())}/login`,
              JSON.stringify({ username: login.username.value, password: login.password.value }), { "Content-Type": "application/json" });
            say(`login of ${login.host.value.trim()} set`);
            login.password.value = "";
            loadImages();
          } catch (e) { say(e.message, true); }
        } }, "Set login")),
      h("p", { class: "muted" }, "Passwords are stored sealed and never shown again; tasks pulling from the registry (or its mirrors) use the login.")),
    h("section", {}, h("h2", {}, "Catalog"), catalogText, h("div", { class: "row" }, h("span", { class: "muted" }, "Regions, clusters, pools, nodes, instance specs, quotas, images, volumes, datasets, models, labels."),
      h("button", { type: "button", id: "save-catalog", onclick: () => { if (confirm("Replace the catalog?")) saveCatalog(catalogText.value); } }, "Save catalog"))),
    h("section", {}, h("h2", { id: "users-title" }, "Users and tokens"),
      h("table", { "aria-labelledby": "users-title" }, h("thead", {}, h("tr", {}, ["User", "Role", "Project groups", "State", ""].map((c) => h("th", { scope: "col" }, c)))), users),
      h("h3", {}, "Add or change a user"),
      h("div", { class: "row-item" }, h("label", {}, "Name ", user.name), h("label", {}, "Role ", user.role), h("label", {}, "Project groups ", user.groups),
        h("button", { type: "button", id: "save-user", onclick: async () => {
          try {
            const groups = user.groups.value.split(",").map((g) => g.trim()).filter(Boolean);
            await api("POST", "/api/v1/admin/users", JSON.stringify({ name: user.name.value, role: user.role.value, groups }), { "Content-Type": "application/json" });
            say(`user ${user.name.value} saved`);
            await loadUsers();
          } catch (e) { say(e.message, true); }
        } }, "Save user"),
        h("button", { type: "button", id: "new-token-for-user", onclick: async () => {
          try {
            const { data } = await api("POST", `/api/v1/users/${encodeURIComponent(user.name.value)}/tokens`, JSON.stringify({ label: "console" }), { "Content-Type": "application/json" });
            tokenOut.textContent = `token for ${user.name.value} (shown once): ${data.token}`;
          } catch (e) { say(e.message, true); }
        } }, "New token")),
      tokenOut, tokensTitle, h("table", { "aria-labelledby": "tokens-title" }, tokenRows)),
    h("section", {}, h("h2", { id: "groups-title" }, "Project groups"),
      h("table", { "aria-labelledby": "groups-title" }, h("thead", {}, h("tr", {}, ["Group", "Members", "Quota"].map((c) => h("th", { scope: "col" }, c)))), groups),
      h("p", { class: "muted" }, "Groups are in the catalog (projectGroups); a user's groups are set above.")),
    h("section", {}, h("h2", {}, "TaskEnv"), h("div", { class: "row-item" }, envUser, h("button", { type: "button", onclick: loadEnv }, "Show")),
      h("table", {}, h("tbody", {}, envRows)),
      h("div", { class: "row-item" }, envNew.name, envNew.value, h("label", {}, envNew.hidden, " hidden"),
        h("button", { type: "button", onclick: async () => {
          try {
            await api("PUT", `/api/v1/users/${encodeURIComponent(envUser.value)}/env`, JSON.stringify({ name: envNew.name.value, value: envNew.value.value, hidden: envNew.hidden.checked }), { "Content-Type": "application/json" });
            loadEnv();
          } catch (e) { say(e.message, true); }
        } }, "Set"))),
  );
  await load();
}
