//! What the console's browser tests share: where screenshots go, signing in, choosing an option, and showing
//! a page in a frame of a given size (its own viewport, so the page's media queries apply to the frame's width).

use super::Server;
use super::webdriver::Browser;
use serde_json::{Value, json};

/// A desktop's and a phone's viewport, in CSS pixels.
pub const DESKTOP: (u32, u32) = (1280, 800);
pub const PHONE: (u32, u32) = (390, 844);

/// Where screenshots go: `target/console-screenshots/`, or `TRAINYARD_SCREENSHOTS`.
pub fn shots() -> std::path::PathBuf {
    std::env::var_os("TRAINYARD_SCREENSHOTS").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots"),
        std::path::PathBuf::from,
    )
}

/// Signs in with `token` (signing out whoever was signed in) and waits for the header to name `user`.
pub fn sign_in_as(b: &Browser, s: &Server, token: &str, user: &str) {
    b.goto(&format!("{}/", s.base));
    b.script("localStorage.clear();", json!([]));
    b.goto("about:blank");
    b.goto(&format!("{}/#/signin", s.base));
    b.type_into(&b.find("#token"), token);
    b.click(&b.find("#signin"));
    b.wait(&format!("{user} signed in"), || (b.text_of("#who-name") == user).then_some(()));
}

/// Signs in as the server's admin.
pub fn sign_in(b: &Browser, s: &Server) {
    sign_in_as(b, s, &s.token, "admin");
}

/// Chooses an option of a select by value, as a user picking it would (a change event).
pub fn pick(b: &Browser, css: &str, value: &str) {
    let el = b.find(css);
    b.script(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
        json!([el.reference(), value]),
    );
}

/// Loads `url` afresh (after [`framed`] replaced the page, a change of hash alone would not draw it).
pub fn reload(b: &Browser, url: &str) {
    b.goto("about:blank");
    b.goto(url);
}

/// Scrolls the page so the section holding `css` is at the top.
pub fn scroll_to(b: &Browser, css: &str) {
    let el = b.find(css);
    b.script("arguments[0].closest('section').scrollIntoView({block: 'start'});", json!([el.reference()]));
}

/// Shows `url` in a frame of `w`×`h` CSS pixels at the top left of a page of the console's origin (so the
/// frame shares its signed-in token) and waits for `css` in it.
pub fn framed(b: &Browser, url: &str, (w, h): (u32, u32), css: &str) {
    b.goto("about:blank");
    b.goto(url.split('#').next().unwrap());
    b.script(
        "document.body.replaceChildren(); document.body.style.background = '#8a8f98';
         const f = document.createElement('iframe');
         f.id = 'frame'; f.src = arguments[0];
         f.style.cssText = `width:${arguments[1]}px;height:${arguments[2]}px;border:0;display:block;background:#fff`;
         document.body.append(f);",
        json!([url, w, h]),
    );
    b.wait(&format!("{css} in the frame"), || {
        let found = b.script(
            "return !!document.getElementById('frame')?.contentDocument?.querySelector(arguments[0])",
            json!([css]),
        );
        (found == json!(true)).then_some(())
    });
}

/// Runs `js` inside the framed document (`d`) and answers what it returns.
pub fn in_frame(b: &Browser, js: &str) -> Value {
    b.script(&format!("const d = document.getElementById('frame').contentDocument; {js}"), json!([]))
}

/// [document scroll width, frame width] of the framed page: the first may not exceed the second.
pub fn framed_widths(b: &Browser) -> (i64, i64) {
    let v = in_frame(b, "return [d.documentElement.scrollWidth, d.documentElement.clientWidth];");
    (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
}
