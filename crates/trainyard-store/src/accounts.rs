//! Users (role, groups, disabled) and their tokens, stored by hash and named by a prefix of it.

use crate::model::{TOKEN_ID_LEN, TOKEN_USE_RESOLUTION_MS, TokenInfo, User};
use crate::rows::user_from_row;
use crate::{Result, Store, StoreError};
use sqlx::Row;

impl Store {
    /// Creates a user, or updates the role and groups of an existing one.
    pub async fn put_user(&self, u: &User, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            let groups = serde_json::to_string(&u.groups).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            sqlx::query(
                "INSERT INTO users (name, role, groups, created_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name) DO UPDATE SET role = $2, groups = $3",
            )
            .bind(&u.name)
            .bind(&u.role)
            .bind(&groups)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    pub async fn get_user(&self, name: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT name, role, groups FROM users WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    pub async fn count_users(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM users").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Every user, by name (name, role and groups only: tokens are elsewhere, as hashes).
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
    /// request its token cache cannot answer).
    pub async fn token_account(&self, hash: &str) -> Result<Option<(User, bool)>> {
        let row = sqlx::query(
            "SELECT u.name, u.role, u.groups, u.disabled FROM tokens t JOIN users u ON u.name = t.user_name \
             WHERE t.hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((user_from_row(&r)?, r.try_get::<i64, _>(3)? != 0))).transpose()
    }

    /// Disables or enables a user; false when there is no such user.
    pub async fn set_user_disabled(&self, name: &str, disabled: bool) -> Result<bool> {
        self.write(async |conn| {
            let n = sqlx::query("UPDATE users SET disabled = $1 WHERE name = $2")
                .bind(i64::from(disabled))
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(n > 0)
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
