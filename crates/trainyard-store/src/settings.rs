//! Named documents the server keeps (the catalog, markers of one-time migrations).

use crate::{Result, Store};
use sqlx::Row;

impl Store {
    /// A named document, if set.
    pub async fn get_setting(&self, name: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(r.try_get(0)?)).transpose()
    }

    /// A named document's stamp, cheap to compare: when it was last set and its length. `None` if unset.
    pub async fn setting_stamp(&self, name: &str) -> Result<Option<(i64, i64)>> {
        let row = sqlx::query("SELECT updated_at_ms, LENGTH(value) FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get::<i64, _>(1)?))).transpose()
    }

    /// Sets a named document.
    pub async fn put_setting(&self, name: &str, value: &str, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO settings (name, value, updated_at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET value = $2, updated_at_ms = $3",
            )
            .bind(name)
            .bind(value)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }
}
