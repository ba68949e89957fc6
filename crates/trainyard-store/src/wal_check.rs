//! A check of a SQLite database's write-ahead log before anything opens it: would SQLite drop frames that
//! held committed writes?
//!
//! SQLite replays the WAL at the first open after a stop that did not close it (a `kill -9`, a crash, a
//! power loss) from its first frame to the first frame whose salts or checksum do not match, and keeps what
//! the last valid commit frame before that covers. Everything after the first damaged frame is dropped in
//! silence, and the next checkpoint overwrites it: a server would start without creates it had
//! acknowledged. So before the first connection, this file reads the WAL as SQLite will and looks past the
//! point where SQLite stops:
//!
//! - frames after a damaged one that still carry this WAL's salts and match their own checksums (each
//!   checked against the stored checksum of the frame before it), among them a commit frame: writes SQLite
//!   would drop. A process that dies only ever leaves a torn frame at the WAL's end, so a damaged frame with
//!   intact commits after it was damaged after it was written (a disk, a copy, a hand). One case cannot be
//!   told apart from that: a power loss during the last commit, whose frames reached the disk out of order
//!   (that commit had not been acknowledged);
//! - a header that does not match its checksum over a WAL that holds frames: SQLite ignores the whole WAL;
//! - the WAL index (`-shm`) that the last process left, when it is intact and describes this WAL: it records
//!   how many frames were committed (`mxFrame`, written only after a commit's frames were synced). More than
//!   SQLite would replay means frames were lost or damaged, even when they are gone altogether (a WAL cut
//!   short), which the WAL alone cannot show.
//!
//! What it cannot see: a WAL cut short (or deleted) when no intact `-shm` describes it (a copy of the
//! database and its WAL without the `-shm`, or a clean machine reboot, which loses the `-shm`'s pages but
//! not the WAL's); a frame damaged in a way that keeps its checksum (its checksums are not cryptographic);
//! damage to the database file itself, which `PRAGMA quick_check` looks for after this.

use std::path::{Path, PathBuf};

const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;
/// The WAL header's magic number; its low bit says the checksums read big-endian words.
const MAGIC: u32 = 0x377f_0682;
const WAL_VERSION: u32 = 3_007_000;
/// The `-shm` file's header: two copies of a 48-byte `WalIndexHdr`.
const SHM_HEADER: usize = 48;

/// The files of a database at `db`.
pub(crate) fn wal_path(db: &Path) -> PathBuf {
    suffixed(db, "-wal")
}

fn shm_path(db: &Path) -> PathBuf {
    suffixed(db, "-shm")
}

fn suffixed(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Checks the WAL of the database at `db` (see the file's header). `Err` says what SQLite would drop.
/// Nothing to check (no WAL, an empty one) is `Ok`.
pub(crate) fn check(db: &Path) -> Result<(), String> {
    // The index first, then the WAL: a process still writing only adds frames after those it counted.
    let shm = std::fs::read(shm_path(db)).ok();
    let Ok(wal) = std::fs::read(wal_path(db)) else { return Ok(()) };
    let page_size_of_db = std::fs::read(db).ok().and_then(|d| db_page_size(&d));
    assess(&wal, shm.as_deref(), page_size_of_db)
}

/// The verdict on a WAL's bytes, with the `-shm` file's if there is one and the database's page size.
pub(crate) fn assess(wal: &[u8], shm: Option<&[u8]>, db_page_size: Option<usize>) -> Result<(), String> {
    if wal.len() < WAL_HEADER {
        return Ok(());
    }
    let header = match Header::read(wal) {
        Some(h) => h,
        None => {
            let page = db_page_size.unwrap_or(4096);
            let frames = (wal.len() - WAL_HEADER) / (FRAME_HEADER + page);
            if frames == 0 {
                return Ok(());
            }
            return Err(format!(
                "its header does not match its checksum, so SQLite would ignore all {frames} frame(s) it holds"
            ));
        }
    };
    let frame_size = FRAME_HEADER + header.page_size;
    let frames = (wal.len() - WAL_HEADER) / frame_size;
    let frame = |i: usize| &wal[WAL_HEADER + i * frame_size..WAL_HEADER + (i + 1) * frame_size];
    // As SQLite replays it: from the header's checksum, frame by frame, to the first that does not match.
    let mut sum = header.checksum;
    let mut replayed = 0; // frames up to the last valid commit
    let mut broken = None;
    for i in 0..frames {
        let f = frame(i);
        match header.frame(f, sum) {
            Some((next, commit)) => {
                sum = next;
                if commit {
                    replayed = i + 1;
                }
            }
            None => {
                broken = Some(i);
                break;
            }
        }
    }
    if let Some(b) = broken {
        // Past the break: frames of this WAL (its salts) that match their checksums from the frame before
        // them. A commit among them was written after the damaged frame.
        let mut later = 0;
        let mut commits = 0;
        for i in b + 1..frames {
            let before = stored_checksum(frame(i - 1));
            if let Some((_, commit)) = header.frame(frame(i), before) {
                later += 1;
                commits += usize::from(commit);
            }
        }
        if commits > 0 {
            return Err(format!(
                "frame {} of {frames} does not match its checksum, and {later} intact frame(s) after it, \
                 {commits} of them commit(s), would be dropped with it: SQLite keeps only the first \
                 {replayed} frame(s)",
                b + 1
            ));
        }
    }
    if let Some(committed) = shm.and_then(|s| committed_frames(s, &wal[16..24]))
        && committed > replayed
    {
        return Err(format!(
            "the WAL index the last process left says {committed} frame(s) were committed, and SQLite \
             would replay only {replayed} of the {frames} frame(s) the WAL holds: the WAL was damaged or \
             cut short after those commits"
        ));
    }
    Ok(())
}

/// A WAL header that matches its checksum.
struct Header {
    big_endian: bool,
    page_size: usize,
    salts: [u8; 8],
    checksum: (u32, u32),
}

impl Header {
    fn read(wal: &[u8]) -> Option<Header> {
        let magic = be(wal, 0);
        if magic & !1 != MAGIC || be(wal, 4) != WAL_VERSION {
            return None;
        }
        let big_endian = magic & 1 == 1;
        let page_size = be(wal, 8) as usize;
        if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
            return None;
        }
        let checksum = checksum(big_endian, &wal[..24], (0, 0));
        if checksum != (be(wal, 24), be(wal, 28)) {
            return None;
        }
        Some(Header { big_endian, page_size, salts: wal[16..24].try_into().ok()?, checksum })
    }

    /// Whether `frame` is valid after a frame whose checksum was `before`, as SQLite decides it (this WAL's
    /// salts, a page number, the checksum): its checksum and whether it ends a commit.
    fn frame(&self, frame: &[u8], before: (u32, u32)) -> Option<((u32, u32), bool)> {
        if frame[8..16] != self.salts || be(frame, 0) == 0 {
            return None;
        }
        let sum = checksum(self.big_endian, &frame[..8], before);
        let sum = checksum(self.big_endian, &frame[FRAME_HEADER..], sum);
        (sum == stored_checksum(frame)).then_some((sum, be(frame, 4) != 0))
    }
}

fn stored_checksum(frame: &[u8]) -> (u32, u32) {
    (be(frame, 16), be(frame, 20))
}

/// SQLite's WAL checksum (`walChecksumBytes`) of `data` (a multiple of 8 bytes), continuing from `start`.
fn checksum(big_endian: bool, data: &[u8], start: (u32, u32)) -> (u32, u32) {
    let (mut s0, mut s1) = start;
    for pair in data.chunks_exact(8) {
        let word = |b: &[u8]| {
            let b = [b[0], b[1], b[2], b[3]];
            if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }
        };
        s0 = s0.wrapping_add(word(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(word(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1)
}

/// The frames the `-shm` index counts as committed (`mxFrame`), if its header is intact (both copies
/// alike, initialised, matching their checksum, in this machine's byte order) and describes the WAL whose
/// salts are `salts`.
fn committed_frames(shm: &[u8], salts: &[u8]) -> Option<usize> {
    if shm.len() < 2 * SHM_HEADER || shm[..SHM_HEADER] != shm[SHM_HEADER..2 * SHM_HEADER] {
        return None;
    }
    let h = &shm[..SHM_HEADER];
    let native = |at: usize| u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    // iVersion, isInit, and the checksum of the first 40 bytes read as native words.
    if native(0) != WAL_VERSION || h[12] != 1 {
        return None;
    }
    let (mut s0, mut s1) = (0u32, 0u32);
    for at in (0..40).step_by(8) {
        s0 = s0.wrapping_add(native(at)).wrapping_add(s1);
        s1 = s1.wrapping_add(native(at + 4)).wrapping_add(s0);
    }
    if (s0, s1) != (native(40), native(44)) || h[32..40] != *salts {
        return None;
    }
    Some(native(16) as usize)
}

/// The page size a database file's header gives (offset 16, big-endian; 1 means 65536).
fn db_page_size(db: &[u8]) -> Option<usize> {
    let raw = u16::from_be_bytes([*db.get(16)?, *db.get(17)?]);
    Some(if raw == 1 { 65536 } else { usize::from(raw) })
}

fn be(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn read(path: PathBuf) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    /// What SQLite leaves in a WAL without damage passes: one it wrote commit by commit, one restarted
    /// after a checkpoint (new frames with new salts over the start, an earlier round's frames after them),
    /// one whose last frame was torn by a crash. Damage in a committed frame does not.
    #[test]
    fn sound_wals_pass_and_a_damaged_frame_does_not() {
        let dir = std::env::temp_dir().join(format!("trainyard-walcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("t.db");
        let _ = std::fs::remove_file(&db);
        let conn = Connection::open(&db).unwrap();
        conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(())).unwrap();
        conn.execute_batch("PRAGMA wal_autocheckpoint=0; CREATE TABLE t (x BLOB);").unwrap();
        for _ in 0..50 {
            conn.execute("INSERT INTO t VALUES (randomblob(3000))", ()).unwrap();
        }
        let first = read(wal_path(&db));
        let shm = read(shm_path(&db));
        assert_eq!(assess(&first, Some(&shm), Some(4096)), Ok(()));
        assert_eq!(check(&db), Ok(()));

        // A crash in the middle of writing a frame: the torn tail is not a commit anyone was told of.
        let torn = &first[..first.len() - 1000];
        assert_eq!(assess(torn, None, Some(4096)), Ok(()));

        // Bytes of a committed frame flipped: the commits after it would be dropped.
        let mut flipped = first.clone();
        let frame = FRAME_HEADER + 4096;
        flipped[WAL_HEADER + 10 * frame + FRAME_HEADER + 7] ^= 1;
        let said = assess(&flipped, None, Some(4096)).unwrap_err();
        assert!(said.contains("frame 11 of") && said.contains("commit"), "{said}");
        // Its header damaged: SQLite would ignore the whole WAL.
        let mut header = first.clone();
        header[20] ^= 1;
        let said = assess(&header, None, Some(4096)).unwrap_err();
        assert!(said.contains("header"), "{said}");

        // Checkpointed, then written again: the WAL restarts at its start with new salts.
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).unwrap();
        for _ in 0..3 {
            conn.execute("INSERT INTO t VALUES (randomblob(3000))", ()).unwrap();
        }
        let restarted = read(wal_path(&db));
        assert_ne!(restarted[16..24], first[16..24], "the WAL restarted");
        assert_eq!(restarted.len(), first.len(), "over the earlier round's frames");
        assert_eq!(assess(&restarted, Some(&read(shm_path(&db))), Some(4096)), Ok(()));
        // The earlier round's index says nothing about this round's WAL.
        assert_eq!(assess(&restarted, Some(&shm), Some(4096)), Ok(()));
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
