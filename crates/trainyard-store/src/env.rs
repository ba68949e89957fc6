//! Users' persistent env vars (`TaskEnv`), which the control loop merges into their tasks at launch.

use crate::model::TaskEnvVar;
use crate::{Result, Store};
use sqlx::Row;

impl Store {
    pub async fn put_task_env(&self, user: &str, var: &TaskEnvVar) -> Result<()> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO task_env (user_name, name, value, hidden) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (user_name, name) DO UPDATE SET value = $3, hidden = $4",
            )
            .bind(user)
            .bind(&var.name)
            .bind(&var.value)
            .bind(i64::from(var.hidden))
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// Removes one; returns whether it existed.
    pub async fn delete_task_env(&self, user: &str, name: &str) -> Result<bool> {
        self.write(async |conn| {
            let n = sqlx::query("DELETE FROM task_env WHERE user_name = $1 AND name = $2")
                .bind(user)
                .bind(name)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(n > 0)
        })
        .await
    }

    /// Every hidden TaskEnv variable of every user (value as stored, sealed), for re-sealing at start-up.
    pub async fn hidden_task_env(&self) -> Result<Vec<(String, TaskEnvVar)>> {
        let rows = sqlx::query(
            "SELECT user_name, name, value FROM task_env WHERE hidden = 1 ORDER BY user_name, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((r.try_get(0)?, TaskEnvVar { name: r.try_get(1)?, value: r.try_get(2)?, hidden: true }))
            })
            .collect()
    }

    /// A user's persistent env vars, by name.
    pub async fn task_env(&self, user: &str) -> Result<Vec<TaskEnvVar>> {
        let rows = sqlx::query("SELECT name, value, hidden FROM task_env WHERE user_name = $1 ORDER BY name")
            .bind(user)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(TaskEnvVar {
                    name: r.try_get(0)?,
                    value: r.try_get(1)?,
                    hidden: r.try_get::<i64, _>(2)? != 0,
                })
            })
            .collect()
    }
}
