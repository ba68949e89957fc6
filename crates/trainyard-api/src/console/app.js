// @ts-check
// The Trainyard console: a hash-routed page over the HTTP API, in small modules served as they are (no build
// step). Each page is a function that builds its part of the document with `h` and calls the API.

import { api, fail, h, show, token } from "./core.js";
import { accountPage } from "./account.js";
import { adminPage } from "./admin.js";
import { comparePage } from "./compare.js";
import { createPage } from "./create.js";
import { taskList } from "./list.js";
import { newTask } from "./new.js";
import { signin, whoami } from "./signin.js";
import { taskPage } from "./task.js";

// The header's link to the page shown says so (aria-current), for assistive technology and the eye. A task's
// page and a comparison of tasks are parts of Tasks.
function markNav(path) {
  const page = path.startsWith("/tasks/") || path === "/compare" ? "/tasks" : path || "/tasks";
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.getAttribute("href") === `#${page}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

async function route() {
  try {
    await page();
  } catch (e) {
    // A refused token already went to sign-in; anything else is said where the page would be.
    if (e.status !== 401) show(fail(e));
  }
}

/** A task's id from its name or its id (a page's address names it by name). */
async function taskId(nameOrId) {
  const { data } = await api("GET", `/api/v1/tasks?q=${encodeURIComponent(nameOrId)}&limit=50`);
  const found = data.items.find((/** @type {any} */ t) => t.name === nameOrId || t.id === nameOrId);
  return found ? found.id : nameOrId;
}

async function page() {
  const [path, query] = location.hash.slice(1).split("?");
  if (!token() && path !== "/signin") { location.hash = "#/signin"; return; }
  markNav(path);
  // Signed out: the header forgets who was signed in.
  if (path === "/signin") { if (!token()) await whoami(); return signin(); }
  const me = await whoami();
  const m = path.match(/^\/tasks\/([^/]+)$/);
  if (m) return taskPage(await taskId(decodeURIComponent(m[1])));
  if (path === "/compare") return comparePage(new URLSearchParams(query || ""));
  if (path === "/new") return newTask();
  if (path === "/create") return createPage(new URLSearchParams(query || ""));
  if (path === "/admin") {
    if (me && me.role !== "admin") return show(h("h1", {}, "Admin"), h("p", { class: "error", role: "alert" }, "This page is for admins. Your own tokens are under Account."));
    return adminPage(me);
  }
  if (path === "/account") return accountPage(me);
  return taskList(new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);
route();
