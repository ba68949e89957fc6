//! What the control crate's commands refuse with.

use trainyard_core::Report;
use trainyard_store::StoreError;

/// A submission refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the task has {} problem(s)", .0.errors().count())]
    Invalid(Report),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A command on a task (or on a user's account) refused.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("task {0} does not exist")]
    NotFound(String),
    #[error("task {name} is {status}; {what}")]
    WrongState { name: String, status: String, what: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored task {0} is unreadable: {1}")]
    Corrupt(String, String),
    #[error("no such user {0:?}")]
    NoSuchUser(String),
    #[error("user {0:?} was deleted; a deleted user cannot be changed, and the name is not used again")]
    UserDeleted(String),
}
