//! Users (role, groups, disabled, deleted, their queued work held) and their tokens, stored by hash and named
//! by a prefix of it.

use crate::model::{AccountState, TOKEN_ID_LEN, TOKEN_USE_RESOLUTION_MS, TokenInfo, User};
use crate::rows::user_from_row;
use crate::{Result, Store, StoreError};
use sqlx::any::AnyRow;
use sqlx::{Connection, Row};
use std::collections::BTreeMap;

/// (disabled, deleted_at_ms, hold_work) to an [`AccountState`].
fn account_state_from_row(r: &AnyRow) -> Result<AccountState> {
    Ok(AccountState {
        disabled: r.try_get::<i64, _>(0)? != 0,
        deleted: r.try_get::<i64, _>(1)? != 0,
        hold_work: r.try_get::<i64, _>(2)? != 0,
    })
}

impl Store {
    /// Creates a user, or updates the role and groups of an existing one; false (nothing written) when the
    /// name is a deleted user's: names are not reused, since tasks, events and shares name their user.
    pub async fn put_user(&self, u: &User, at_ms: i64) -> Result<bool> {
        self.write(async |conn| {
            let groups = serde_json::to_string(&u.groups).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let n = sqlx::query(
                "INSERT INTO users (name, role, groups, created_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name) DO UPDATE SET role = $2, groups = $3 WHERE users.deleted_at_ms = 0",
            )
            .bind(&u.name)
            .bind(&u.role)
            .bind(&groups)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            Ok(n > 0)
        })
        .await
    }

    /// A user who was not deleted.
    pub async fn get_user(&self, name: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT name, role, groups FROM users WHERE name = $1 AND deleted_at_ms = 0")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// What an admin made of a user (deleted ones included); `None`: no such name was ever used.
    pub async fn account_state(&self, name: &str) -> Result<Option<AccountState>> {
        let row = sqlx::query("SELECT disabled, deleted_at_ms, hold_work FROM users WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(account_state_from_row).transpose()
    }

    /// Every user who is disabled or deleted, with their state: what the control loop holds queued work by,
    /// and what lists show.
    pub async fn account_states(&self) -> Result<BTreeMap<String, AccountState>> {
        let rows = sqlx::query(
            "SELECT disabled, deleted_at_ms, hold_work, name FROM users \
             WHERE disabled <> 0 OR deleted_at_ms <> 0 ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get(3)?, account_state_from_row(r)?))).collect()
    }

    pub async fn count_users(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM users").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Every user, by name, deleted ones included (name, role and groups only: tokens are elsewhere, as
    /// hashes).
    pub async fn list_users(&self) -> Result<Vec<User>> {
        let rows =
            sqlx::query("SELECT name, role, groups FROM users ORDER BY name").fetch_all(&self.pool).await?;
        rows.iter().map(user_from_row).collect()
    }

    /// Records a token by its hash.
    pub async fn add_token(&self, hash: &str, user: &str, label: &str, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            sqlx::query("INSERT INTO tokens (hash, user_name, label, created_at_ms) VALUES ($1, $2, $3, $4)")
                .bind(hash)
                .bind(user)
                .bind(label)
                .bind(at_ms)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// The user a token hash belongs to, and whether that user is disabled (one read: the API asks on every
    /// request its token cache cannot answer). A deleted user's tokens are gone, and none would be found.
    pub async fn token_account(&self, hash: &str) -> Result<Option<(User, bool)>> {
        let row = sqlx::query(
            "SELECT u.name, u.role, u.groups, u.disabled FROM tokens t JOIN users u ON u.name = t.user_name \
             WHERE t.hash = $1 AND u.deleted_at_ms = 0",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((user_from_row(&r)?, r.try_get::<i64, _>(3)? != 0))).transpose()
    }

    /// Disables a user, their queued work held or not (`hold_work`), or enables them (their work released);
    /// false when there is no such user (or they were deleted).
    pub async fn set_user_disabled(&self, name: &str, disabled: bool, hold_work: bool) -> Result<bool> {
        self.write(async |conn| {
            let n = sqlx::query(
                "UPDATE users SET disabled = $1, hold_work = $2 WHERE name = $3 AND deleted_at_ms = 0",
            )
            .bind(i64::from(disabled))
            .bind(i64::from(disabled && hold_work))
            .bind(name)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            Ok(n > 0)
        })
        .await
    }

    /// Deletes a user, in one transaction: every token of theirs removed, the account disabled and marked
    /// deleted at `at_ms` (the row stays: the name is retired, never reused), their queued work held or not.
    /// Their tasks stay, for the record. False when there is no such user or they were deleted already.
    pub async fn delete_user(&self, name: &str, hold_work: bool, at_ms: i64) -> Result<bool> {
        self.write(async |conn| {
            let mut tx = conn.begin().await?;
            let n = sqlx::query(
                "UPDATE users SET disabled = 1, hold_work = $1, deleted_at_ms = $2 \
                 WHERE name = $3 AND deleted_at_ms = 0",
            )
            .bind(i64::from(hold_work))
            .bind(at_ms.max(1))
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(false);
            }
            sqlx::query("DELETE FROM tokens WHERE user_name = $1").bind(name).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    /// The names of disabled users.
    pub async fn disabled_users(&self) -> Result<std::collections::BTreeSet<String>> {
        let rows = sqlx::query("SELECT name FROM users WHERE disabled = 1").fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// A user's tokens, oldest first: never the token or its full hash, only an id ([`TOKEN_ID_LEN`] hex
    /// characters of the hash) to revoke it by.
    pub async fn list_tokens(&self, user: &str) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query(
            "SELECT hash, label, created_at_ms, last_used_at_ms FROM tokens WHERE user_name = $1 \
             ORDER BY created_at_ms, hash",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let hash: String = r.try_get(0)?;
                let used: i64 = r.try_get(3)?;
                Ok(TokenInfo {
                    id: hash.chars().take(TOKEN_ID_LEN).collect(),
                    label: r.try_get(1)?,
                    created_at_ms: r.try_get(2)?,
                    last_used_at_ms: (used > 0).then_some(used),
                })
            })
            .collect()
    }

    /// Records that a token was used at `at_ms`. A use within [`TOKEN_USE_RESOLUTION_MS`] of the recorded
    /// one (or an older one) writes nothing, so a busy token costs a write a minute at most.
    pub async fn touch_token(&self, hash: &str, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            sqlx::query("UPDATE tokens SET last_used_at_ms = $1 WHERE hash = $2 AND last_used_at_ms <= $3")
                .bind(at_ms)
                .bind(hash)
                .bind(at_ms - TOKEN_USE_RESOLUTION_MS)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// Revokes (deletes) a user's token by its id; false when the user has no such token.
    pub async fn revoke_token(&self, user: &str, id: &str) -> Result<bool> {
        self.write(async |conn| {
            if id.len() != TOKEN_ID_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(false);
            }
            let sql =
                format!("DELETE FROM tokens WHERE user_name = $1 AND substr(hash, 1, {TOKEN_ID_LEN}) = $2");
            let n = sqlx::query(&sql)
                .bind(user)
                .bind(id.to_ascii_lowercase())
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(n > 0)
        })
        .await
    }

    /// The user a token hash belongs to.
    pub async fn user_for_token(&self, hash: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT user_name FROM tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => self.get_user(&r.try_get::<String, _>(0)?).await,
            None => Ok(None),
        }
    }
}
