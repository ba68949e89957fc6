//! Task ids and name suffixes.

use std::hash::{BuildHasher, Hasher};

/// Random enough for where ids and name suffixes start counting: the standard library's per-process random
/// hash keys.
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

/// The suffixes of new task names: five characters that count up. Most significant first, in an alphabet in
/// ASCII order, consecutive suffixes sort next to each other, so the store's unique index on names takes a
/// burst of new tasks on one page instead of one page each (random suffixes wrote a page of that index per
/// create, half the pages of a commit). The count starts at a random place in each process; a taken name
/// moves it to another random place, so a run of names taken earlier (by a server that counted there
/// before a restart, or by another server on the same database) costs one retry, not one per name.
pub(crate) struct NameSuffixes {
    next: std::sync::atomic::AtomicU64,
}

/// How many suffixes there are: five characters of 36.
const SUFFIXES: u64 = 36u64.pow(5);

/// This process's name suffixes.
pub(crate) static NAME_SUFFIXES: std::sync::LazyLock<NameSuffixes> =
    std::sync::LazyLock::new(NameSuffixes::new);

impl NameSuffixes {
    fn new() -> Self {
        Self { next: std::sync::atomic::AtomicU64::new(random_u64() % SUFFIXES) }
    }

    /// The next suffix.
    pub(crate) fn take(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        suffix(n % SUFFIXES)
    }

    /// A name with the last suffix was taken: count on from somewhere else.
    pub(crate) fn jump(&self) {
        self.next.store(random_u64() % SUFFIXES, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The suffix numbered `n` (below [`SUFFIXES`]): base 36, most significant digit first.
fn suffix(n: u64) -> String {
    const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut n = n;
    let mut out = [0u8; 5];
    for c in out.iter_mut().rev() {
        *c = ALPHABET[(n % 36) as usize];
        n /= 36;
    }
    out.iter().map(|&c| c as char).collect()
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

    #[test]
    fn name_suffixes_count_up_in_sorting_order_and_wrap() {
        assert_eq!(suffix(0), "00000");
        assert_eq!(suffix(35), "0000z");
        assert_eq!(suffix(36), "00010");
        assert_eq!(suffix(SUFFIXES - 1), "zzzzz");
        let names = NameSuffixes::new();
        let taken: Vec<String> = (0..1_000).map(|_| names.take()).collect();
        assert!(
            taken
                .iter()
                .all(|s| s.len() == 5 && s.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()))
        );
        // Consecutive suffixes sort in the order they were taken, except where the count wraps.
        let wraps = taken.windows(2).filter(|w| w[0] >= w[1]).count();
        assert!(wraps <= 1, "{wraps} places out of order in {taken:?}");
        assert_eq!(taken.iter().collect::<std::collections::BTreeSet<_>>().len(), 1_000, "no repeats");
        let wrapping = NameSuffixes { next: std::sync::atomic::AtomicU64::new(SUFFIXES - 1) };
        assert_eq!((wrapping.take(), wrapping.take()), ("zzzzz".to_owned(), "00000".to_owned()));
    }
}
