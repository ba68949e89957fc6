//! The second line: the unpack runs on a thread of its own with an unprivileged uid and gid and no
//! capabilities.

/// Runs `f` on a thread of its own as user and group `id` with no supplementary groups and no capabilities
/// (None: as this process is). The switch is the thread's alone (Linux keeps credentials per thread; the
/// raw calls do not spread them to the process's other threads, as libc's wrappers would), and the thread
/// ends with `f`, so nothing else ever runs with them. Threads `f` starts inherit them.
pub fn unprivileged<T: Send>(id: Option<u32>, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        let h = std::thread::Builder::new()
            .name("image-unpack".into())
            .spawn_scoped(scope, move || {
                if let Some(id) = id {
                    drop_to(id)
                        .map_err(|e| format!("cannot switch the unpacking thread to uid {id}: {e}"))?;
                }
                Ok(f())
            })
            .map_err(|e| format!("cannot start the unpacking thread: {e}"))?;
        h.join().map_err(|_| "the unpacking thread failed unexpectedly".to_owned())?
    })
}

fn drop_to(id: u32) -> rustix::io::Result<()> {
    use rustix::process::{Gid, Uid};
    rustix::thread::set_thread_groups(&[])?;
    let (g, u) = (Gid::from_raw(id), Uid::from_raw(id));
    rustix::thread::set_thread_res_gid(g, g, g)?;
    // With every uid non-zero, the kernel clears the thread's capabilities.
    rustix::thread::set_thread_res_uid(u, u, u)
}
