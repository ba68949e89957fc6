//! Who besides a task's owner may see it or operate it: admins, members of its group when it is public,
//! and the users it is shared with.

use crate::model::{TaskRecord, Viewer};
use crate::{Result, Store};
use sqlx::Row;

impl Store {
    /// Whether `viewer` may see the task: admin, owner, a member of its group when it is public, or shared.
    pub async fn visible(&self, task: &TaskRecord, viewer: &Viewer) -> Result<bool> {
        if viewer.admin
            || task.owner == viewer.user
            || (task.public && viewer.groups.contains(&task.project_group))
        {
            return Ok(true);
        }
        let row = sqlx::query("SELECT 1 FROM task_shares WHERE task_id = $1 AND user_name = $2")
            .bind(&task.id)
            .bind(&viewer.user)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Shares a task with a user (`operate`: may also stop, resubmit and delete it).
    pub async fn share(&self, task_id: &str, user: &str, operate: bool) -> Result<()> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO task_shares (task_id, user_name, operate) VALUES ($1, $2, $3) \
                 ON CONFLICT (task_id, user_name) DO UPDATE SET operate = $3",
            )
            .bind(task_id)
            .bind(user)
            .bind(i64::from(operate))
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// Takes a share back: `user` sees the task (and operates it) only as anyone else would. Whether there was
    /// one to take back.
    pub async fn unshare(&self, task_id: &str, user: &str) -> Result<bool> {
        self.write(async |conn| {
            let done = sqlx::query("DELETE FROM task_shares WHERE task_id = $1 AND user_name = $2")
                .bind(task_id)
                .bind(user)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    /// The users a task is shared with, by name, and whether each may operate it.
    pub async fn shares(&self, task_id: &str) -> Result<Vec<(String, bool)>> {
        let rows =
            sqlx::query("SELECT user_name, operate FROM task_shares WHERE task_id = $1 ORDER BY user_name")
                .bind(task_id)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)? != 0))).collect()
    }

    /// Whether `user` was given operate rights on the task.
    pub async fn may_operate(&self, task_id: &str, user: &str) -> Result<bool> {
        let row = sqlx::query("SELECT operate FROM task_shares WHERE task_id = $1 AND user_name = $2")
            .bind(task_id)
            .bind(user)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<i64, _>(0)? != 0,
            None => false,
        })
    }
}
