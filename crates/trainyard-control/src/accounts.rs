//! What becomes of a user's work when an admin disables, enables or deletes them.
//!
//! The admin chooses, per change, what happens to the user's queued tasks (held, stopped, or kept going) and
//! to the running ones (stopped through the usual stop path, which runs the exit checkpoint protocol, or
//! kept running); by default queued work is held and running work stopped. Decide, then act: [`decide`]
//! says what each task gets, a pure function of its status and the choice; [`Control::change_account`]
//! writes the account first, then stops what the decision says.
//!
//! A hold is not written on the tasks: it is the account's (`hold_work` in the store), and the loop leaves a
//! held owner's queued tasks out of every plan, waiting with [`held_reason`] on the board, for as long as the
//! account holds them. So a task of theirs that is queued later (preempted, retried) is held too, and
//! enabling the account releases every one of them at the next plan. The loop reads the accounts from the
//! store at its start and at every full sync (another server may have changed them), and at once when the
//! change is made through it.

use crate::Control;
use crate::error::CommandError;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use trainyard_core::lifecycle::Status;
use trainyard_runtime::Backend;
use trainyard_store::{AccountState, StoreError};

/// What becomes of a disabled or deleted user's queued tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueuedWork {
    /// They stay queued but are not admitted until the user is enabled again (the default).
    #[default]
    Hold,
    /// They are stopped now, and any queued later (a running one preempted) is held.
    Stop,
    /// They are admitted as if nothing happened.
    Keep,
}

/// What becomes of a disabled or deleted user's running tasks (admitted, starting or running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunningWork {
    /// Stopped as a user's stop is: the exit checkpoint protocol, then termination (the default).
    #[default]
    Stop,
    /// They run on to their end.
    Keep,
}

/// An admin's choice of what happens to a user's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkChoice {
    pub queued: QueuedWork,
    pub running: RunningWork,
}

impl WorkChoice {
    /// Whether the account holds the user's queued work from now on (everything but `Keep`: a task stopped
    /// now could not run, and one queued again later must not either).
    pub fn holds(self) -> bool {
        self.queued != QueuedWork::Keep
    }
}

/// What an admin does to an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountChange {
    Disable(WorkChoice),
    /// Enabled again: held work released.
    Enable,
    /// Deleted: tokens removed, name retired, tasks kept for the record.
    Delete(WorkChoice),
}

/// What one of the user's tasks gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAction {
    /// Stopped now (a queued task at once, a running one through Stopping).
    Stop,
    /// Left queued, not admitted while the account holds it.
    Hold,
    /// Nothing: it goes on, or there is nothing to do (stopping already, ended).
    Leave,
}

/// What a change does to one task of the user in `status`: the pure decision.
pub fn decide(status: Status, change: AccountChange) -> TaskAction {
    let choice = match change {
        AccountChange::Enable => return TaskAction::Leave,
        AccountChange::Disable(c) | AccountChange::Delete(c) => c,
    };
    match status {
        Status::Queued => match choice.queued {
            QueuedWork::Hold => TaskAction::Hold,
            QueuedWork::Stop => TaskAction::Stop,
            QueuedWork::Keep => TaskAction::Leave,
        },
        // Stopping already: its stop goes on as it was asked for.
        Status::Stopping => TaskAction::Leave,
        s if s.holds_resources() => match choice.running {
            RunningWork::Stop => TaskAction::Stop,
            RunningWork::Keep => TaskAction::Leave,
        },
        _ => TaskAction::Leave,
    }
}

/// Whether an account holds its owner's queued work.
pub fn holds(state: AccountState) -> bool {
    state.hold_work && (state.disabled || state.deleted)
}

/// The wait reason a held task shows (users and admins see it on the task).
pub fn held_reason(state: AccountState) -> &'static str {
    if state.deleted {
        "held: the owner's account was deleted, so it is not admitted (an admin may stop it)"
    } else {
        "held: the owner's account is disabled; it waits until an admin enables the account again"
    }
}

/// What a change did: the user's tasks it stopped and those it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountOutcome {
    pub stopped: Vec<String>,
    pub held: Vec<String>,
}

/// Disabled and deleted users, as the loop last read them: whose queued work is held, and who was deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountBook {
    states: BTreeMap<String, AccountState>,
}

impl AccountBook {
    pub fn new(states: BTreeMap<String, AccountState>) -> Self {
        AccountBook { states }
    }

    /// The state of an account that is disabled or deleted (`None`: neither).
    pub fn state(&self, user: &str) -> Option<AccountState> {
        self.states.get(user).copied()
    }

    /// Whether `user`'s queued work is held.
    pub fn holds(&self, user: &str) -> bool {
        self.state(user).is_some_and(holds)
    }

    /// Whether no account holds anything (the loop's fast path).
    pub fn holds_nothing(&self) -> bool {
        !self.states.values().any(|s| holds(*s))
    }

    pub fn deleted(&self, user: &str) -> bool {
        self.state(user).is_some_and(|s| s.deleted)
    }
}

/// The book shared between the loop and readers (the API shows deleted owners from it).
#[derive(Debug, Clone, Default)]
pub struct AccountsHandle(Arc<RwLock<Arc<AccountBook>>>);

impl AccountsHandle {
    pub fn get(&self) -> Arc<AccountBook> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `book` up; whether it differs from the one it replaces.
    fn set(&self, book: AccountBook) -> bool {
        let mut held = self.0.write().unwrap_or_else(|e| e.into_inner());
        if **held == book {
            return false;
        }
        *held = Arc::new(book);
        true
    }
}

/// How many times a stop that lost a race with another change of the task is tried again.
const STOP_TRIES: usize = 3;

impl<B: Backend> Control<B> {
    /// The accounts the loop holds work by, shared with readers.
    pub fn accounts(&self) -> AccountsHandle {
        self.accounts.clone()
    }

    /// Reads the disabled and deleted accounts from the store; a change makes the next plan whole.
    pub(crate) async fn refresh_accounts(&mut self) -> Result<(), StoreError> {
        let book = AccountBook::new(self.store.account_states().await?);
        if self.accounts.set(book) {
            self.changed();
        }
        Ok(())
    }

    /// Disables, enables or deletes `user`, and does to their work what `change` says: the account is
    /// written first (from then on the loop holds their queued work, if the choice holds it), then each task
    /// [`decide`] stops is stopped as a user's stop is. Refused for a user that does not exist, and for a
    /// deleted one (the name is retired). Deleting needs the user's tokens gone at once: the store removes
    /// them in the same transaction.
    pub async fn change_account(
        &mut self,
        user: &str,
        change: AccountChange,
        now_ms: i64,
    ) -> Result<AccountOutcome, CommandError> {
        let state =
            self.store.account_state(user).await?.ok_or_else(|| CommandError::NoSuchUser(user.into()))?;
        if state.deleted {
            return Err(CommandError::UserDeleted(user.into()));
        }
        let written = match change {
            AccountChange::Disable(choice) => {
                self.store.set_user_disabled(user, true, choice.holds()).await?
            }
            AccountChange::Enable => self.store.set_user_disabled(user, false, false).await?,
            AccountChange::Delete(choice) => self.store.delete_user(user, choice.holds(), now_ms).await?,
        };
        if !written {
            // Deleted meanwhile (by another server).
            return Err(CommandError::UserDeleted(user.into()));
        }
        self.refresh_accounts().await?;
        let statuses =
            [Status::Queued, Status::Admitted, Status::Starting, Status::Prechecking, Status::Running];
        let mut outcome = AccountOutcome::default();
        for t in self.store.owner_tasks_in_status(user, &statuses).await? {
            match decide(t.status, change) {
                TaskAction::Leave => {}
                TaskAction::Hold => outcome.held.push(t.id),
                TaskAction::Stop => {
                    let why = match change {
                        AccountChange::Delete(_) => "stopped: its owner's account was deleted",
                        _ => "stopped: its owner's account was disabled",
                    };
                    if self.stop_for_account(&t.id, why, now_ms).await? {
                        outcome.stopped.push(t.id);
                    }
                }
            }
        }
        Ok(outcome)
    }

    /// Stops a task for its owner's account; false when there was nothing left to stop (it ended, or began
    /// to stop, meanwhile). A stop that lost a race with another change is tried again with the new state.
    async fn stop_for_account(
        &self,
        task_id: &str,
        why: &'static str,
        now_ms: i64,
    ) -> Result<bool, CommandError> {
        for _ in 0..STOP_TRIES {
            match self.stop_with(task_id, false, why, now_ms).await {
                Ok(_) => return Ok(true),
                Err(CommandError::WrongState { .. }) => {
                    let now = self.store.get_task(task_id).await?;
                    if now.is_none_or(|t| t.status.is_terminal() || t.status == Status::Stopping) {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(CommandError::WrongState {
            name: task_id.to_owned(),
            status: "changing".into(),
            what: "it kept changing while its owner's account was changed; stop it again",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AccountChange::*;
    use Status::*;
    use TaskAction as A;

    fn choice(queued: QueuedWork, running: RunningWork) -> WorkChoice {
        WorkChoice { queued, running }
    }

    /// Every status, in the order `check`'s expectations list them.
    const STATUSES: [Status; 9] =
        [Queued, Admitted, Starting, Prechecking, Running, Stopping, Succeeded, Failed, Stopped];

    /// The actions a change gives a task in each of [`STATUSES`].
    fn check(change: AccountChange, expected: [TaskAction; 9]) {
        let got: Vec<TaskAction> = STATUSES.iter().map(|s| decide(*s, change)).collect();
        assert_eq!(got, expected, "{change:?}");
    }

    #[test]
    fn the_default_holds_the_queued_and_stops_the_running() {
        let d = WorkChoice::default();
        assert_eq!(d, choice(QueuedWork::Hold, RunningWork::Stop));
        for change in [Disable(d), Delete(d)] {
            check(
                change,
                [A::Hold, A::Stop, A::Stop, A::Stop, A::Stop, A::Leave, A::Leave, A::Leave, A::Leave],
            );
        }
    }

    #[test]
    fn each_choice_does_what_it_says() {
        let (h, s, k) = (QueuedWork::Hold, QueuedWork::Stop, QueuedWork::Keep);
        let (stop, keep) = (RunningWork::Stop, RunningWork::Keep);
        let l = A::Leave;
        check(Disable(choice(s, stop)), [A::Stop, A::Stop, A::Stop, A::Stop, A::Stop, l, l, l, l]);
        check(Disable(choice(h, keep)), [A::Hold, l, l, l, l, l, l, l, l]);
        check(Disable(choice(k, keep)), [l; 9]);
        check(Delete(choice(k, stop)), [l, A::Stop, A::Stop, A::Stop, A::Stop, l, l, l, l]);
        check(Enable, [l; 9]);
    }

    #[test]
    fn only_keep_leaves_later_queued_work_free() {
        assert!(choice(QueuedWork::Hold, RunningWork::Keep).holds());
        assert!(choice(QueuedWork::Stop, RunningWork::Keep).holds(), "a task preempted later stays held");
        assert!(!choice(QueuedWork::Keep, RunningWork::Stop).holds());
    }

    #[test]
    fn an_account_holds_while_disabled_or_deleted() {
        let s = |disabled, deleted, hold_work| AccountState { disabled, deleted, hold_work };
        assert!(holds(s(true, false, true)));
        assert!(holds(s(true, true, true)));
        assert!(!holds(s(true, false, false)), "disabled, work kept");
        assert!(!holds(s(false, false, true)), "enabled: whatever the flag says");
        let book =
            AccountBook::new([("a".into(), s(true, false, true)), ("b".into(), s(true, true, false))].into());
        assert!(book.holds("a") && !book.holds("b") && !book.holds("c"));
        assert!(book.deleted("b") && !book.deleted("a"));
        assert!(!book.holds_nothing());
        assert!(AccountBook::new([("b".into(), s(true, true, false))].into()).holds_nothing());
        assert!(held_reason(s(true, false, true)).contains("disabled"));
        assert!(held_reason(s(true, true, true)).contains("deleted"));
    }
}
