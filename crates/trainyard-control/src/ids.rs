//! Task ids and name suffixes.

use std::hash::{BuildHasher, Hasher};

/// Random enough for ids and name suffixes: the standard library's per-process random hash keys.
pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

/// A new task id: 16 hex digits, the submission time in milliseconds (44 bits) then a per-process counter
/// (20 bits) that starts at a random value. Ids of one process never repeat (up to a million a
/// millisecond), two servers on one database almost never collide (a collision is retried like a taken
/// name), and ids grow with time, so the store's indexes on them take new tasks at their end instead of
/// at random places (fewer pages written per commit).
pub(crate) fn task_id(now_ms: i64) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(random_u64);
    let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) & 0xF_FFFF;
    let ms = (now_ms.max(0) as u64) & ((1 << 44) - 1);
    format!("{:016x}", (ms << 20) | n)
}

pub(crate) fn suffix(n: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut n = n;
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % 36) as usize] as char;
            n /= 36;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_unique_and_grow_with_time() {
        let same_ms: std::collections::BTreeSet<String> =
            (0..100_000).map(|_| task_id(1_764_000_000_000)).collect();
        assert_eq!(same_ms.len(), 100_000, "no repeats within one millisecond");
        assert!(same_ms.iter().all(|id| id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit())));
        let (earlier, later) = (task_id(1_764_000_000_000), task_id(1_764_000_000_001));
        assert!(earlier < later, "{earlier} < {later}: a later millisecond sorts after");
    }
}
