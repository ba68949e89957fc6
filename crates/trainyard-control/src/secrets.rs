//! Hidden env values at rest: sealed with ChaCha20-Poly1305 under the server key before they are stored,
//! opened only to hand a task to a backend. The API masks them and never needs the key.
//!
//! Every sealed value is bound to the record it belongs to ([`Binding`]: a task's id, owner and variable
//! name; or a TaskEnv variable's user and name) as AEAD associated data. A sealed string copied out of the
//! database into another record (another task, another user's TaskEnv, a plain value) does not open, so
//! the server is not a decryption oracle for anyone holding a copy of its database. Only values stored as
//! hidden are ever opened; callers never pass a plain value to [`SecretBox::open_value`].
//!
//! Values sealed by earlier versions (`sealed:v1:`, no binding) are re-sealed in place once at start-up
//! ([`reseal_legacy`]); after that a `v1` value is refused like a damaged one.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};
use std::io::Read;
use trainyard_core::spec::{EnvVar, TrainingTask};

/// How a sealed value starts: version, then hex of nonce and ciphertext. `v2` values carry a binding.
const SEALED_PREFIX: &str = "sealed:v2:";

/// Values sealed before bindings existed; opened only by [`reseal_legacy`].
const LEGACY_PREFIX: &str = "sealed:v1:";

/// The record a sealed value belongs to. It is the associated data of the AEAD: opening with any other
/// binding fails the tag check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding<'a> {
    /// A hidden env value (`spec.environment.env` or the precheck's env) of one task.
    Task { id: &'a str, owner: &'a str, name: &'a str },
    /// A hidden TaskEnv variable of one user.
    TaskEnv { user: &'a str, name: &'a str },
    /// A registry's password, for one user name at one registry host.
    Registry { host: &'a str, username: &'a str },
}

impl Binding<'_> {
    /// The associated data: a JSON array, so no choice of names can make two bindings' bytes equal.
    fn aad(&self) -> Vec<u8> {
        let fields = match self {
            Binding::Task { id, owner, name } => ["task", id, owner, name],
            Binding::TaskEnv { user, name } => ["task-env", user, name, ""],
            Binding::Registry { host, username } => ["registry", host, username, ""],
        };
        serde_json::to_vec(&fields).expect("an array of strings always serialises")
    }
}

/// The server key.
#[derive(Clone)]
pub struct SecretBox {
    key: [u8; 32],
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox(..)")
    }
}

/// A sealed value that cannot be opened (another key, or damaged).
#[derive(Debug, thiserror::Error)]
#[error("a hidden value cannot be opened with this server key")]
pub struct OpenError;

/// Lower-case hex, by table (every create digests its body, every request hashes its token).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[allow(clippy::disallowed_methods)] // Keys and nonces are the one randomness the crate draws itself.
fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

impl SecretBox {
    pub fn new(key: [u8; 32]) -> Self {
        SecretBox { key }
    }

    /// A fresh random key.
    pub fn generate() -> std::io::Result<Self> {
        Ok(SecretBox { key: random()? })
    }

    /// The key as 64 hex characters, for the key file.
    pub fn to_hex(&self) -> String {
        hex(&self.key)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let bytes = unhex(s.trim())?;
        Some(SecretBox { key: bytes.try_into().ok()? })
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(Key::from_slice(&self.key))
    }

    /// Seals one value for the record `binding` names.
    pub fn seal_value(&self, value: &str, binding: &Binding) -> std::io::Result<String> {
        let nonce: [u8; 12] = random()?;
        let aad = binding.aad();
        let sealed = self
            .cipher()
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: value.as_bytes(), aad: &aad })
            .map_err(|_| std::io::Error::other("encryption failed"))?;
        Ok(format!("{SEALED_PREFIX}{}{}", hex(&nonce), hex(&sealed)))
    }

    /// Opens a value sealed for the record `binding` names. Anything else is refused: a value sealed for
    /// another record, under another key, damaged, sealed by an old version, or never sealed at all (a
    /// hidden value is always stored sealed, so a plain one there was put in the database by hand).
    pub fn open_value(&self, value: &str, binding: &Binding) -> Result<String, OpenError> {
        let body = value.strip_prefix(SEALED_PREFIX).ok_or(OpenError)?;
        self.decrypt(body, &binding.aad())
    }

    fn decrypt(&self, body: &str, aad: &[u8]) -> Result<String, OpenError> {
        let bytes = unhex(body).ok_or(OpenError)?;
        if bytes.len() < 12 {
            return Err(OpenError);
        }
        let (nonce, sealed) = bytes.split_at(12);
        let plain = self
            .cipher()
            .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad })
            .map_err(|_| OpenError)?;
        String::from_utf8(plain).map_err(|_| OpenError)
    }

    /// Opens a value sealed by an earlier version (no binding), for [`reseal_legacy`] only. `None` when the
    /// value is not in the old format.
    fn open_legacy(&self, value: &str) -> Option<Result<String, OpenError>> {
        value.strip_prefix(LEGACY_PREFIX).map(|body| self.decrypt(body, b""))
    }

    fn each_hidden(task: &mut TrainingTask, mut f: impl FnMut(&mut EnvVar)) {
        task.spec.environment.env.iter_mut().filter(|v| v.hidden).for_each(&mut f);
        if let Some(p) = task.spec.advanced.precheck.as_mut() {
            p.env.iter_mut().filter(|v| v.hidden).for_each(&mut f);
        }
    }

    /// Seals every hidden value of the task in place, bound to the task's id and owner.
    pub fn seal(&self, task: &mut TrainingTask, id: &str, owner: &str) -> std::io::Result<()> {
        let mut result = Ok(());
        Self::each_hidden(task, |v| {
            match self.seal_value(&v.value, &Binding::Task { id, owner, name: &v.name }) {
                Ok(s) => v.value = s,
                Err(e) => result = Err(e),
            }
        });
        result
    }

    /// Opens every hidden value of the task in place (plain values are left as they are, whatever they look
    /// like); each must have been sealed for this task and owner.
    pub fn open(&self, task: &mut TrainingTask, id: &str, owner: &str) -> Result<(), OpenError> {
        let mut result = Ok(());
        Self::each_hidden(task, |v| {
            match self.open_value(&v.value, &Binding::Task { id, owner, name: &v.name }) {
                Ok(s) => v.value = s,
                Err(e) => result = Err(e),
            }
        });
        result
    }

    /// The token with which one attempt's pods fetch its working directory (`tyw.TASK.ATTEMPT.MAC`): good for
    /// that attempt alone, and only while it has not ended (the server checks that on each use). Any server
    /// on the store makes and checks the same, from the key they share.
    pub fn workdir_token(&self, task_id: &str, attempt: i64) -> String {
        format!("{WORKDIR_TOKEN_PREFIX}{task_id}.{attempt}.{}", self.workdir_mac(task_id, attempt))
    }

    /// The task id and attempt a [`workdir_token`](Self::workdir_token) was made for, if this key made it.
    pub fn workdir_token_attempt(&self, token: &str) -> Option<(String, i64)> {
        let rest = token.strip_prefix(WORKDIR_TOKEN_PREFIX)?;
        let (rest, mac) = rest.rsplit_once('.')?;
        let (task_id, attempt) = rest.rsplit_once('.')?;
        let attempt: i64 = attempt.parse().ok()?;
        // Compared as digests of each, so the time taken says nothing of the MAC.
        let want = self.workdir_mac(task_id, attempt);
        (Sha256::digest(want.as_bytes()) == Sha256::digest(mac.as_bytes()))
            .then(|| (task_id.to_owned(), attempt))
    }

    fn workdir_mac(&self, task_id: &str, attempt: i64) -> String {
        self.digest(format!("trainyard workdir fetch\0{task_id}\0{attempt}").as_bytes())
    }

    /// A keyed digest (idempotency: a stored hash of a body must not help anyone guess its hidden values).
    pub fn digest(&self, data: &[u8]) -> String {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(data);
        hex(&h.finalize())
    }
}

/// How a working directory's fetch token ([`SecretBox::workdir_token`]) begins.
pub const WORKDIR_TOKEN_PREFIX: &str = "tyw.";

/// The setting that records that [`reseal_legacy`] has run on this store, so later starts skip the scan.
pub const SEALED_FORMAT_SETTING: &str = "sealed-format";

/// What [`reseal_legacy`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resealed {
    pub tasks: usize,
    pub task_env: usize,
}

/// Re-seals, bound to their records, every hidden value an earlier version sealed without a binding
/// (`sealed:v1:`): in tasks' specs and in TaskEnv. Only values stored as hidden are opened (a plain value
/// that merely looks sealed stays plain text). Runs once per store (recorded in [`SEALED_FORMAT_SETTING`]);
/// a value that does not open under this key is left as it is, and refused at launch like before.
pub async fn reseal_legacy(
    store: &trainyard_store::Store,
    secrets: &SecretBox,
    now_ms: i64,
) -> Result<Resealed, trainyard_store::StoreError> {
    let mut done = Resealed::default();
    if store.get_setting(SEALED_FORMAT_SETTING).await?.as_deref() == Some("v2") {
        return Ok(done);
    }
    let corrupt = |e: std::io::Error| trainyard_store::StoreError::Corrupt(format!("cannot seal: {e}"));
    for t in store.tasks_with_spec_containing(LEGACY_PREFIX).await? {
        let (Some(mut task), _) = trainyard_core::parse(t.spec_json.as_bytes()) else { continue };
        let mut changed = false;
        let mut failed = None;
        SecretBox::each_hidden(&mut task, |v| {
            if let Some(Ok(plain)) = secrets.open_legacy(&v.value) {
                match secrets.seal_value(&plain, &Binding::Task { id: &t.id, owner: &t.owner, name: &v.name })
                {
                    Ok(s) => {
                        v.value = s;
                        changed = true;
                    }
                    Err(e) => failed = Some(e),
                }
            }
        });
        if let Some(e) = failed {
            return Err(corrupt(e));
        }
        if changed {
            let spec_json = serde_json::to_string(&task).expect("a TrainingTask always serialises");
            store.replace_spec(&t.id, &spec_json).await?;
            done.tasks += 1;
        }
    }
    for (user, mut var) in store.hidden_task_env().await? {
        if let Some(Ok(plain)) = secrets.open_legacy(&var.value) {
            var.value = secrets
                .seal_value(&plain, &Binding::TaskEnv { user: &user, name: &var.name })
                .map_err(corrupt)?;
            store.put_task_env(&user, &var).await?;
            done.task_env += 1;
        }
    }
    store.put_setting(SEALED_FORMAT_SETTING, "v2", now_ms).await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workdir_token_names_its_attempt_and_nothing_else() {
        let b = SecretBox::new([7; 32]);
        let t = b.workdir_token("t-a.b", 3);
        assert_eq!(b.workdir_token_attempt(&t), Some(("t-a.b".to_owned(), 3)));
        assert_eq!(SecretBox::new([8; 32]).workdir_token_attempt(&t), None, "another key's token");
        let (head, mac) = t.rsplit_once('.').unwrap();
        let other = b.workdir_token("t-a.b", 4);
        let (_, other_mac) = other.rsplit_once('.').unwrap();
        assert_eq!(b.workdir_token_attempt(&format!("{head}.{other_mac}")), None, "attempt 4's MAC on 3");
        assert_eq!(b.workdir_token_attempt(&t.replace(".3.", ".4.")), None, "the attempt changed");
        assert_eq!(b.workdir_token_attempt(&format!("{head}.{}", &mac[1..])), None, "a cut MAC");
        assert_eq!(b.workdir_token_attempt(&t[4..]), None, "without its prefix");
    }

    #[test]
    fn hex_is_lower_case_two_digits_a_byte_and_reads_back() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)), Some(all));
    }

    const TASK: Binding = Binding::Task { id: "t1", owner: "alice", name: "TOKEN" };

    #[test]
    fn seal_and_open() {
        let b = SecretBox::new([7; 32]);
        let sealed = b.seal_value("s3cret", &TASK).unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX) && !sealed.contains("s3cret"));
        assert_ne!(sealed, b.seal_value("s3cret", &TASK).unwrap(), "a fresh nonce each time");
        assert_eq!(b.open_value(&sealed, &TASK).unwrap(), "s3cret");
        assert!(SecretBox::new([8; 32]).open_value(&sealed, &TASK).is_err(), "another key cannot open it");
        // One hex digit changed: the tag no longer matches, so it is refused rather than opened to garbage.
        let mut damaged = sealed.clone();
        let last = damaged.pop().unwrap();
        damaged.push(if last == '0' { '1' } else { '0' });
        assert!(b.open_value(&damaged, &TASK).is_err());
        assert_eq!(SecretBox::from_hex(&b.to_hex()).unwrap().key, b.key);
        assert!(b.open_value("plain", &TASK).is_err(), "a hidden value is never stored in clear");
    }

    /// A sealed value copied into another record does not open there.
    #[test]
    fn a_sealed_value_opens_only_for_its_own_record() {
        let b = SecretBox::new([7; 32]);
        let sealed = b.seal_value("s3cret", &TASK).unwrap();
        for other in [
            Binding::Task { id: "t2", owner: "alice", name: "TOKEN" },
            Binding::Task { id: "t1", owner: "mallory", name: "TOKEN" },
            Binding::Task { id: "t1", owner: "alice", name: "OTHER" },
            Binding::TaskEnv { user: "alice", name: "TOKEN" },
            Binding::TaskEnv { user: "t1", name: "alice" },
        ] {
            assert!(b.open_value(&sealed, &other).is_err(), "{other:?} opened a value sealed for {TASK:?}");
        }
        let env = b.seal_value("k", &Binding::TaskEnv { user: "alice", name: "K" }).unwrap();
        assert_eq!(b.open_value(&env, &Binding::TaskEnv { user: "alice", name: "K" }).unwrap(), "k");
        assert!(b.open_value(&env, &Binding::TaskEnv { user: "mallory", name: "K" }).is_err());
    }

    /// An old, unbound value is refused at launch; only the one-time migration opens it.
    #[test]
    fn legacy_values_open_only_for_the_migration() {
        let b = SecretBox::new([7; 32]);
        let nonce = [3u8; 12];
        let ct = b.cipher().encrypt(Nonce::from_slice(&nonce), &b"old"[..]).unwrap();
        let legacy = format!("{LEGACY_PREFIX}{}{}", hex(&nonce), hex(&ct));
        assert!(b.open_value(&legacy, &TASK).is_err());
        assert_eq!(b.open_legacy(&legacy).unwrap().unwrap(), "old");
        assert!(b.open_legacy("plain").is_none());
    }
}
