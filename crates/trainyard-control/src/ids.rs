//! Task ids and name suffixes, drawn from an [`Ids`]: the process's own (random starting points, shared by
//! every `Control` and `Submitter` of the process), or a seed's, so that a seeded simulation replays with the
//! same ids and names.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Random enough for where ids and name suffixes start counting: the standard library's per-process random
/// hash keys, and the clock.
#[allow(clippy::disallowed_methods)] // The one place ids read the clock: where the process starts counting.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

/// Where new task ids and name suffixes come from. Cheap to share (`Arc`); the default is the process's.
#[derive(Debug, Default)]
pub struct Ids {
    seeded: Option<Seeded>,
}

/// A seed's ids: counters of their own, and the places a taken name jumps to drawn from the seed.
#[derive(Debug)]
struct Seeded {
    next_id: AtomicU64,
    names: NameSuffixes,
    /// The state of a SplitMix64 sequence.
    draws: AtomicU64,
}

impl Ids {
    /// The process's ids: counted from random places, shared by every user of this process (ids of one
    /// process never repeat).
    pub fn process() -> Ids {
        Ids { seeded: None }
    }

    /// Ids that are a function of `seed` and the order of the calls: for simulations and tests that must
    /// replay exactly. Two `Ids` of one seed draw the same ids, so one store takes one.
    pub fn seeded(seed: u64) -> Ids {
        let draws = AtomicU64::new(seed);
        let first = splitmix(&draws);
        let names = NameSuffixes { next: AtomicU64::new(splitmix(&draws) % SUFFIXES) };
        Ids { seeded: Some(Seeded { next_id: AtomicU64::new(first), names, draws }) }
    }

    /// A new task id (see [`task_id`]).
    pub(crate) fn task_id(&self, now_ms: i64) -> String {
        match &self.seeded {
            None => task_id(now_ms),
            Some(s) => id_at(now_ms, s.next_id.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The next name suffix.
    pub(crate) fn name_suffix(&self) -> String {
        match &self.seeded {
            None => NAME_SUFFIXES.take(),
            Some(s) => s.names.take(),
        }
    }

    /// A name with the last suffix was taken: count on from somewhere else.
    pub(crate) fn name_taken(&self) {
        match &self.seeded {
            None => NAME_SUFFIXES.jump(random_u64()),
            Some(s) => s.names.jump(splitmix(&s.draws)),
        }
    }
}

/// The next draw of a SplitMix64 sequence whose state is `state`.
fn splitmix(state: &AtomicU64) -> u64 {
    let mut z = state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A new task id: 16 hex digits, the submission time in milliseconds (44 bits) then a per-process counter
/// (20 bits) that starts at a random value. Ids of one process never repeat (up to a million a
/// millisecond), two servers on one database almost never collide (a collision is retried like a taken
/// name), and ids grow with time, so the store's indexes on them take new tasks at their end instead of
/// at random places (fewer pages written per commit).
fn task_id(now_ms: i64) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(random_u64);
    id_at(now_ms, start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// The id of the `n`th task (only its low 20 bits count) submitted at `now_ms`.
fn id_at(now_ms: i64, n: u64) -> String {
    let ms = (now_ms.max(0) as u64) & ((1 << 44) - 1);
    format!("{:016x}", (ms << 20) | (n & 0xF_FFFF))
}

/// The suffixes of new task names: five characters that count up. Most significant first, in an alphabet in
/// ASCII order, consecutive suffixes sort next to each other, so the store's unique index on names takes a
/// burst of new tasks on one page instead of one page each (random suffixes wrote a page of that index per
/// create, half the pages of a commit). The count starts at a random place in each process; a taken name
/// moves it to another random place, so a run of names taken earlier (by a server that counted there
/// before a restart, or by another server on the same database) costs one retry, not one per name.
#[derive(Debug)]
struct NameSuffixes {
    next: AtomicU64,
}

/// How many suffixes there are: five characters of 36.
const SUFFIXES: u64 = 36u64.pow(5);

/// This process's name suffixes.
static NAME_SUFFIXES: std::sync::LazyLock<NameSuffixes> = std::sync::LazyLock::new(NameSuffixes::new);

impl NameSuffixes {
    fn new() -> Self {
        Self { next: AtomicU64::new(random_u64() % SUFFIXES) }
    }

    /// The next suffix.
    fn take(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        suffix(n % SUFFIXES)
    }

    /// A name with the last suffix was taken: count on from `draw` (any number) instead.
    fn jump(&self, draw: u64) {
        self.next.store(draw % SUFFIXES, Ordering::Relaxed);
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
        let wrapping = NameSuffixes { next: AtomicU64::new(SUFFIXES - 1) };
        assert_eq!((wrapping.take(), wrapping.take()), ("zzzzz".to_owned(), "00000".to_owned()));
    }

    /// What a seeded `Ids` draws: ids, suffixes, and suffixes after a taken name.
    fn draws(ids: &Ids) -> Vec<String> {
        let mut out = vec![ids.task_id(1_000), ids.task_id(1_000), ids.name_suffix(), ids.name_suffix()];
        ids.name_taken();
        out.push(ids.name_suffix());
        out
    }

    #[test]
    fn a_seed_draws_the_same_ids_every_time_and_another_seed_others() {
        let first = draws(&Ids::seeded(7));
        assert_eq!(first, draws(&Ids::seeded(7)), "the same seed");
        assert_ne!(first, draws(&Ids::seeded(8)), "another seed");
        assert_ne!(first[0], first[1], "ids do not repeat");
        assert!(first[0] < first[1], "and count up within a millisecond: {first:?}");
        assert_ne!(first[2], first[3], "nor do suffixes");
    }
}
