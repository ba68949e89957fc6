//! Passwordless SSH between an attempt's replicas, as every backend makes it: one key pair per attempt (the
//! replicas' identity) and one host key (every replica's sshd).

use std::path::Path;

/// An ed25519 key pair at `path` (kept if it is there).
pub fn keygen(path: &Path) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "trainyard", "-f"])
        .arg(path)
        .output()
        .map_err(|e| format!("passwordless SSH needs ssh-keygen (apt-get install openssh-client): {e}"))?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) }
}

/// The attempt's key pair (the replicas' identity) and host key (every replica's sshd).
pub fn make_keys(ssh: &Path) -> Result<(), String> {
    std::fs::create_dir_all(ssh).map_err(|e| e.to_string())?;
    keygen(&ssh.join("id_ed25519"))?;
    keygen(&ssh.join("host_ed25519"))
}
