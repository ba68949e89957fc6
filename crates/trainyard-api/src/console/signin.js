// @ts-check
// Signing in with a token, and who is signed in (the header).

import { api, h, show, token, TOKEN_KEY } from "./core.js";

export async function whoami() {
  const who = document.getElementById("who");
  const nav = document.getElementById("nav");
  if (!token()) {
    who.replaceChildren();
    nav.hidden = true;
    return null;
  }
  try {
    const { data } = await api("GET", "/api/v1/whoami");
    nav.hidden = false;
    document.getElementById("nav-admin").hidden = data.role !== "admin";
    who.replaceChildren(
      h("span", { id: "who-name" }, data.name),
      h("span", { class: "muted" }, ` ${data.role} · ${data.groups.join(", ") || "no group"} `),
      h("button", { type: "button", class: "link", onclick: () => { localStorage.removeItem(TOKEN_KEY); location.hash = "#/signin"; } }, "Sign out"),
    );
    return data;
  } catch (e) {
    return null;
  }
}

export function signin() {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const msg = h("p", { role: "alert" });
  const form = h("form", {
    class: "card narrow",
    onsubmit: async (ev) => {
      ev.preventDefault();
      localStorage.setItem(TOKEN_KEY, input.value.trim());
      const me = await whoami();
      if (me) location.hash = "#/tasks";
      else {
        localStorage.removeItem(TOKEN_KEY);
        msg.textContent = "That token was not accepted.";
        msg.className = "error";
      }
    },
  },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { class: "muted" }, "The token `trainyard up` printed, or one an admin made for you."),
    h("button", { type: "submit", id: "signin" }, "Sign in"),
    msg,
  );
  show(form);
  input.focus();
}
