//! Working directories: the user's code and small data, travelling with a task.
//!
//! - [`manifest`]: what a working directory is: its entries (dirs, files by SHA-256, links inside it), checked
//!   entry by entry, and its id, the digest of the canonical manifest. Pure.
//! - [`pack`]: the client's side: a directory walked as git would (`.gitignore`, `.trainyardignore`, `.git`
//!   left out), every problem found at once (a link out of it, a special file, a name that is not UTF-8,
//!   over a limit) before anything is sent.
//! - `rules`: which entries stay home: `.gitignore` files as git reads them (those above the directory only
//!   within its repository), `.git/info/exclude`, `.trainyardignore`.
//! - [`store`]: the server's side: per project group, files kept by digest (written aside, checked, then
//!   renamed in: never half visible), manifests kept by id, usage, collection of what nothing uses, and a
//!   manifest made into a directory (a replica's `/workspace`).
//!
//! The upload is three steps: the manifest is checked (what the server lacks comes back), the missing files
//! are sent as tar streams whose entries are named by digest, and the manifest is committed. A second
//! submit of the same tree sends only the manifest.

pub mod manifest;
pub mod pack;
mod rules;
pub mod store;

pub use manifest::{Entry, Kind, Manifest};
