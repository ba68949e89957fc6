//! Why a pull failed, in classes a user can act on, and which of them are worth another try.

use std::fmt;

/// The class of a failed pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// The registry has no such repository, tag or digest.
    NotFound,
    /// The registry refused the credentials (or asked for some and none are configured).
    Unauthorized,
    /// The registry could not be reached or answered with a server error (connection refused, a timeout,
    /// TLS failure, 5xx, 429).
    Unreachable,
    /// A blob's bytes do not hash to the digest the manifest names.
    DigestMismatch,
    /// No space left under the image cache (or less than this machine keeps free): another try would fill
    /// the disk again, so it fails at once.
    DiskFull,
    /// Larger than this machine takes: more bytes or entries than an image or a layer may unpack to, or
    /// larger than the whole image cache.
    TooLarge,
    /// The image cannot run here (unsupported media type or platform, a malformed manifest or layer, no
    /// `bash`).
    Invalid,
}

impl FailureClass {
    /// Whether another try may succeed without anyone changing anything: the image pull tolerance applies
    /// to these; the others fail the attempt at once.
    pub fn retryable(self) -> bool {
        matches!(self, FailureClass::Unreachable | FailureClass::DigestMismatch)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::NotFound => "not-found",
            FailureClass::Unauthorized => "unauthorized",
            FailureClass::Unreachable => "registry-unreachable",
            FailureClass::DigestMismatch => "digest-mismatch",
            FailureClass::DiskFull => "disk-full",
            FailureClass::TooLarge => "too-large",
            FailureClass::Invalid => "invalid-image",
        }
    }
}

/// A failed pull: its class and a message for the task's owner (what failed and what to do about it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullError {
    pub class: FailureClass,
    pub message: String,
}

impl PullError {
    pub fn new(class: FailureClass, message: impl Into<String>) -> PullError {
        PullError { class, message: message.into() }
    }

    /// An I/O failure under the cache: disk full when the kernel says so, otherwise the cache is broken.
    pub fn io(what: &str, e: &std::io::Error) -> PullError {
        if e.raw_os_error() == Some(28) || e.kind() == std::io::ErrorKind::StorageFull {
            return PullError::new(
                FailureClass::DiskFull,
                format!("{what}: no space left on the image cache's disk (prune the cache or free space)"),
            );
        }
        PullError::new(FailureClass::Invalid, format!("{what}: {e}"))
    }
}

impl fmt::Display for PullError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.class.as_str())
    }
}

impl std::error::Error for PullError {}

/// Classifies the registry client's error.
pub(crate) fn classify(image: &str, e: &oci_client::errors::OciDistributionError) -> PullError {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    let text = e.to_string();
    let class = match e {
        E::ImageManifestNotFoundError(_) => FailureClass::NotFound,
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => FailureClass::Unauthorized,
        E::DigestError(_) => FailureClass::DigestMismatch,
        E::RequestError(_) => FailureClass::Unreachable,
        E::IoError(io) => return PullError::io(&format!("pulling {image}"), io),
        E::ServerError { code, .. } => match code {
            401 | 403 => FailureClass::Unauthorized,
            404 => FailureClass::NotFound,
            408 | 429 | 500..=599 => FailureClass::Unreachable,
            _ => FailureClass::Invalid,
        },
        E::RegistryError { envelope, .. } => {
            let codes: Vec<&C> = envelope.errors.iter().map(|x| &x.code).collect();
            if codes.iter().any(|c| matches!(c, C::Unauthorized | C::Denied)) {
                FailureClass::Unauthorized
            } else if codes
                .iter()
                .any(|c| matches!(c, C::ManifestUnknown | C::NameUnknown | C::NotFound | C::BlobUnknown))
            {
                FailureClass::NotFound
            } else if codes.iter().any(|c| matches!(c, C::Toomanyrequests)) {
                FailureClass::Unreachable
            } else {
                FailureClass::Invalid
            }
        }
        _ => FailureClass::Invalid,
    };
    let hint = match class {
        FailureClass::NotFound => "check the repository and tag, or that the image was pushed",
        FailureClass::Unauthorized => {
            "the registry refused this task's access: ask an admin to set this registry's credentials for it \
             (a registry login serves the catalog's image presets offered to the task's project group, and the \
             project groups the login names)"
        }
        FailureClass::Unreachable => {
            "the registry may be down; the pull is retried as the image pull tolerance allows"
        }
        FailureClass::DigestMismatch => {
            "the registry served bytes that are not the image's (a damaged blob or a proxy rewriting it)"
        }
        _ => "this image cannot be run here",
    };
    PullError::new(class, format!("pulling {image}: {text}; {hint}"))
}
