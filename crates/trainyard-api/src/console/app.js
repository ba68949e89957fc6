// The Trainyard console: a hash-routed page over the HTTP API, in small modules served as they are (no build
// step). Each page is a function that builds its part of the document with `h` and calls the API.

import { token } from "./core.js";
import { adminPage } from "./admin.js";
import { createPage } from "./create.js";
import { taskList } from "./list.js";
import { newTask } from "./new.js";
import { signin, whoami } from "./signin.js";
import { taskPage } from "./task.js";

async function route() {
  const [path, query] = location.hash.slice(1).split("?");
  if (!token() && path !== "/signin") { location.hash = "#/signin"; return; }
  if (path === "/signin") return signin();
  await whoami();
  const m = path.match(/^\/tasks\/([^/]+)$/);
  if (m) return taskPage(decodeURIComponent(m[1]));
  if (path === "/new") return newTask();
  if (path === "/create") return createPage(new URLSearchParams(query || ""));
  if (path === "/admin") return adminPage();
  return taskList(new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);
route();
