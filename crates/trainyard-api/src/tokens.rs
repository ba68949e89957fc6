//! API tokens: how one is made and stored (only its hash), and the cache that spares a request the store
//! lookup to authenticate.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use trainyard_store::User;

/// The hash under which a token is stored.
pub fn token_hash(token: &str) -> String {
    // Every request hashes its token to find it in the cache.
    trainyard_control::secrets::hex(&Sha256::digest(token.as_bytes()))
}

/// A new random token, from the operating system's generator.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(format!("ty_{}", trainyard_control::secrets::hex(&buf)))
}

/// Recently seen tokens and their users (and whether the user is disabled), so a request costs no store
/// lookup to authenticate. An entry lives [`TOKEN_CACHE_TTL`]: a revoked token, a disabled user or a changed
/// role takes effect within that time on every server sharing the store, and at once on the server that
/// made the change ([`TokenCache::forget_user`]).
#[derive(Debug, Clone, Default)]
pub struct TokenCache(Arc<std::sync::RwLock<BTreeMap<String, (Account, std::time::Instant)>>>);

/// A token's user and whether that user is disabled.
pub type Account = (User, bool);

/// How long an authenticated token is trusted without asking the store again.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);
/// Cached tokens at most (a bound on memory; the cache is cleared when full).
const TOKEN_CACHE_MAX: usize = 10_000;

impl TokenCache {
    pub(crate) fn get(&self, hash: &str) -> Option<Account> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(hash).filter(|(_, at)| at.elapsed() < TOKEN_CACHE_TTL).map(|(u, _)| u.clone())
    }

    /// Drops every cached token of a user (their tokens or their account changed).
    pub fn forget_user(&self, name: &str) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, ((u, _), _)| u.name != name);
    }

    pub(crate) fn put(&self, hash: String, user: Account) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= TOKEN_CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (user, std::time::Instant::now()));
    }
}
