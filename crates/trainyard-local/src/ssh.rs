//! Passwordless SSH between an attempt's replicas: one key pair per attempt, sshd on port 22 in each
//! replica's own network namespace.

use super::*;

pub(crate) use trainyard_runtime::ssh::make_keys;

/// The attempt's keys and each replica's sshd: port 22 in the replica's own network namespace, the user the
/// replicas run as, keys in its home (scratch, which the server just made).
pub(super) fn ssh_material(
    ssh: &Path,
    home: &Path,
    runtime: &Path,
    replicas: &[Replica],
    user: &str,
) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let io = |e: std::io::Error| e.to_string();
    let dot = home.join(".ssh");
    std::fs::create_dir_all(&dot).map_err(io)?;
    std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519"), dot.join("id_ed25519")).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519.pub"), dot.join("id_ed25519.pub")).map_err(io)?;
    std::fs::copy(ssh.join("id_ed25519.pub"), dot.join("authorized_keys")).map_err(io)?;
    let mut config = String::new();
    for r in replicas {
        config.push_str(&format!(
            "Host {name}\n  HostName {name}\n  Port 22\n  User {user}\n  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            name = r.name,
            user = user,
        ));
    }
    std::fs::write(dot.join("config"), config).map_err(io)?;
    let sdir = runtime.join("ssh");
    std::fs::create_dir_all(&sdir).map_err(io)?;
    std::fs::copy(ssh.join("host_ed25519"), sdir.join("host_ed25519")).map_err(io)?;
    std::fs::set_permissions(sdir.join("host_ed25519"), std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    let sshd = format!(
        "Port 22\nListenAddress 0.0.0.0\nHostKey {RUNTIME_DIR}/ssh/host_ed25519\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nAuthorizedKeysFile /root/.ssh/authorized_keys\nStrictModes no\nUsePAM no\nPidFile none\nSetEnv TRAINYARD_SSH=1\n"
    );
    std::fs::write(sdir.join("sshd_config"), sshd).map_err(io)?;
    Ok(())
}
