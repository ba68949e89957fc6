//! Hidden env values at rest: sealed with ChaCha20-Poly1305 under the server key before a task is stored,
//! opened only to hand the task to a backend. The API masks them and never needs the key.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};
use std::io::Read;
use trainyard_core::spec::{EnvVar, TrainingTask};

/// How a sealed value starts: version, then hex of nonce and ciphertext.
const SEALED_PREFIX: &str = "sealed:v1:";

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

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

    /// Seals one value.
    pub fn seal_value(&self, value: &str) -> std::io::Result<String> {
        let nonce: [u8; 12] = random()?;
        let sealed = self
            .cipher()
            .encrypt(Nonce::from_slice(&nonce), value.as_bytes())
            .map_err(|_| std::io::Error::other("encryption failed"))?;
        Ok(format!("{SEALED_PREFIX}{}{}", hex(&nonce), hex(&sealed)))
    }

    /// Opens one value (a value that was never sealed comes back as it is).
    pub fn open_value(&self, value: &str) -> Result<String, OpenError> {
        let Some(body) = value.strip_prefix(SEALED_PREFIX) else { return Ok(value.to_owned()) };
        let bytes = unhex(body).ok_or(OpenError)?;
        if bytes.len() < 12 {
            return Err(OpenError);
        }
        let (nonce, sealed) = bytes.split_at(12);
        let plain = self.cipher().decrypt(Nonce::from_slice(nonce), sealed).map_err(|_| OpenError)?;
        String::from_utf8(plain).map_err(|_| OpenError)
    }

    fn each_hidden(task: &mut TrainingTask, mut f: impl FnMut(&mut EnvVar)) {
        task.spec.environment.env.iter_mut().filter(|v| v.hidden).for_each(&mut f);
        if let Some(p) = task.spec.advanced.precheck.as_mut() {
            p.env.iter_mut().filter(|v| v.hidden).for_each(&mut f);
        }
    }

    /// Seals every hidden value of the task in place.
    pub fn seal(&self, task: &mut TrainingTask) -> std::io::Result<()> {
        let mut result = Ok(());
        Self::each_hidden(task, |v| match self.seal_value(&v.value) {
            Ok(s) => v.value = s,
            Err(e) => result = Err(e),
        });
        result
    }

    /// Opens every sealed value of the task in place.
    pub fn open(&self, task: &mut TrainingTask) -> Result<(), OpenError> {
        let mut result = Ok(());
        Self::each_hidden(task, |v| match self.open_value(&v.value) {
            Ok(s) => v.value = s,
            Err(e) => result = Err(e),
        });
        result
    }

    /// A keyed digest (idempotency: a stored hash of a body must not help anyone guess its hidden values).
    pub fn digest(&self, data: &[u8]) -> String {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(data);
        hex(&h.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_and_open() {
        let b = SecretBox::new([7; 32]);
        let sealed = b.seal_value("s3cret").unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX) && !sealed.contains("s3cret"));
        assert_ne!(sealed, b.seal_value("s3cret").unwrap(), "a fresh nonce each time");
        assert_eq!(b.open_value(&sealed).unwrap(), "s3cret");
        assert!(SecretBox::new([8; 32]).open_value(&sealed).is_err(), "another key cannot open it");
        // One hex digit changed: the tag no longer matches, so it is refused rather than opened to garbage.
        let mut damaged = sealed.clone();
        let last = damaged.pop().unwrap();
        damaged.push(if last == '0' { '1' } else { '0' });
        assert!(b.open_value(&damaged).is_err());
        assert_eq!(SecretBox::from_hex(&b.to_hex()).unwrap().key, b.key);
        assert_eq!(b.open_value("plain").unwrap(), "plain");
    }
}
