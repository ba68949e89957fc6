//! The task list: visibility, filters, search, order and the cursor, built as one query.

use crate::model::{MAX_PAGE, Page, SortOrder, TaskFilter, TaskRecord};
use crate::rows::{Arg, TASK_READ, bind_all, task_from_row};
use crate::{Result, Store, StoreError};

/// How a list matches its search text.
#[derive(Clone, Copy)]
enum Search<'a> {
    None,
    /// The task whose id or name this is.
    Exact(&'a str),
    /// Tasks whose name holds this (or whose id it is).
    Substring(&'a str),
}

/// The column a list is sorted by, and whether ascending.
fn sort_key(order: SortOrder) -> (&'static str, bool) {
    match order {
        SortOrder::Newest => ("t.created_at_ms", false),
        SortOrder::Oldest => ("t.created_at_ms", true),
        SortOrder::Name => ("t.name", true),
        SortOrder::Updated => ("t.updated_at_ms", false),
    }
}

impl Store {
    /// Tasks matching `filter` in its order, `limit` (at most [`MAX_PAGE`]) at a time. Specs are left out
    /// (a list shows none; [`Store::get_task`] has it).
    ///
    /// A search that is exactly a task's id or name (what a user pastes) finds that task alone, through
    /// the unique indexes, instead of scanning every name for the text.
    pub async fn list_tasks(&self, filter: &TaskFilter, cursor: Option<&str>, limit: u32) -> Result<Page> {
        if let Some(s) = &filter.search
            && cursor.is_none()
        {
            let exact = self.list_page(filter, None, limit, Search::Exact(s)).await?;
            if !exact.items.is_empty() {
                return Ok(exact);
            }
        }
        let search = filter.search.as_deref().map_or(Search::None, Search::Substring);
        self.list_page(filter, cursor, limit, search).await
    }

    /// One page of the list, matching `search` as given.
    async fn list_page(
        &self,
        filter: &TaskFilter,
        cursor: Option<&str>,
        limit: u32,
        search: Search<'_>,
    ) -> Result<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let (sql, args) = list_query(filter, cursor, limit, search)?;
        let rows = bind_all(sqlx::query(&sql), &args).fetch_all(&self.pool).await?;
        let mut items = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|t| cursor_after(filter.sort, t))
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}

impl Store {
    /// The specs (as stored) and creation times of a user's newest `limit` tasks, newest first (by the
    /// owner index): what the console's recently used images are read from.
    pub async fn recent_specs(&self, owner: &str, limit: u32) -> Result<Vec<(String, i64)>> {
        use sqlx::Row;
        let rows = sqlx::query(
            "SELECT spec, created_at_ms FROM tasks WHERE owner = $1 AND deleted = 0 \
             ORDER BY created_at_ms DESC LIMIT $2",
        )
        .bind(owner)
        .bind(i64::from(limit.min(MAX_PAGE)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?))).collect()
    }
}

/// The query of one page and its parameters: `limit + 1` rows, so that the caller knows whether another
/// page follows.
fn list_query(
    filter: &TaskFilter,
    cursor: Option<&str>,
    limit: u32,
    search: Search<'_>,
) -> Result<(String, Vec<Arg>)> {
    let columns = TASK_READ.replace("spec,", "'' AS spec,");
    let mut sql = format!("SELECT {columns} FROM tasks t WHERE deleted = 0");
    let mut args: Vec<Arg> = Vec::new();
    let mut push = |sql: &mut String, clause: &str, values: Vec<Arg>| {
        // Each `?` in `clause` becomes the next `$N`.
        let mut out = String::new();
        let mut vals = values.into_iter();
        for ch in clause.chars() {
            if ch == '?' {
                args.push(vals.next().expect("one value per placeholder"));
                out.push_str(&format!("${}", args.len()));
            } else {
                out.push(ch);
            }
        }
        sql.push_str(" AND ");
        sql.push_str(&out);
    };
    if let Some(v) = &filter.visible_to
        && !v.admin
    {
        let mut clause = String::from("(t.owner = ?");
        let mut vals = vec![Arg::Text(v.user.clone())];
        if !v.groups.is_empty() {
            clause.push_str(" OR (t.public = 1 AND t.project_group IN (");
            clause.push_str(&vec!["?"; v.groups.len()].join(", "));
            clause.push_str("))");
            vals.extend(v.groups.iter().cloned().map(Arg::Text));
        }
        clause
            .push_str(" OR EXISTS (SELECT 1 FROM task_shares s WHERE s.task_id = t.id AND s.user_name = ?))");
        vals.push(Arg::Text(v.user.clone()));
        push(&mut sql, &clause, vals);
    }
    if let Some(user) = &filter.operable_by {
        push(
            &mut sql,
            "(t.owner = ? OR EXISTS (SELECT 1 FROM task_shares s WHERE s.task_id = t.id AND s.user_name = ? \
             AND s.operate = 1))",
            vec![Arg::Text(user.clone()), Arg::Text(user.clone())],
        );
    }
    for (col, val) in [
        ("t.owner", &filter.owner),
        ("t.status", &filter.status.map(|s| s.as_str().to_owned())),
        ("t.task_type", &filter.task_type),
        ("t.accelerator", &filter.accelerator.map(|a| a.as_str().to_owned())),
    ] {
        if let Some(v) = val {
            push(&mut sql, &format!("{col} = ?"), vec![Arg::Text(v.clone())]);
        }
    }
    match filter.project_groups.as_slice() {
        [] => {}
        // One group is an equality, which the group index serves in order.
        [one] => push(&mut sql, "t.project_group = ?", vec![Arg::Text(one.clone())]),
        many => push(
            &mut sql,
            &format!("t.project_group IN ({})", vec!["?"; many.len()].join(", ")),
            many.iter().cloned().map(Arg::Text).collect(),
        ),
    }
    match search {
        Search::None => {}
        Search::Exact(s) => {
            push(
                &mut sql,
                "(t.id = ? OR t.name = ?)",
                vec![Arg::Text(s.to_owned()), Arg::Text(s.to_owned())],
            );
        }
        Search::Substring(s) => {
            let pattern = format!("%{}%", s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
            push(
                &mut sql,
                "(t.id = ? OR t.name LIKE ? ESCAPE '\\')",
                vec![Arg::Text(s.to_owned()), Arg::Text(pattern)],
            );
        }
    }
    for (k, v) in &filter.labels {
        push(
            &mut sql,
            "EXISTS (SELECT 1 FROM task_labels l WHERE l.task_id = t.id AND l.key = ? AND l.value = ?)",
            vec![Arg::Text(k.clone()), Arg::Text(v.clone())],
        );
    }
    // A cursor is `<sort key>.<id>` of the last item of the previous page (ids hold no dot).
    let (col, asc) = sort_key(filter.sort);
    if let Some(c) = cursor {
        let (key, id) = c.rsplit_once('.').ok_or_else(|| StoreError::Corrupt(format!("bad cursor {c:?}")))?;
        let key = if filter.sort == SortOrder::Name {
            Arg::Text(key.to_owned())
        } else {
            Arg::Int(key.parse().map_err(|_| StoreError::Corrupt(format!("bad cursor {c:?}")))?)
        };
        let op = if asc { ">" } else { "<" };
        push(
            &mut sql,
            &format!("({col} {op} ? OR ({col} = ? AND t.id {op} ?))"),
            vec![key.clone(), key, Arg::Text(id.to_owned())],
        );
    }
    let dir = if asc { "ASC" } else { "DESC" };
    sql.push_str(&format!(" ORDER BY {col} {dir}, t.id {dir} LIMIT {}", limit + 1));
    Ok((sql, args))
}

/// The cursor of the page after `last`: its sort key and id (ids hold no dot).
fn cursor_after(sort: SortOrder, last: &TaskRecord) -> String {
    let key = match sort {
        SortOrder::Newest | SortOrder::Oldest => last.created_at_ms.to_string(),
        SortOrder::Updated => last.updated_at_ms.to_string(),
        SortOrder::Name => last.name.clone(),
    };
    format!("{key}.{}", last.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Accelerator;
    use trainyard_core::lifecycle::Status;

    /// Every list sorted by creation, under each filter an index serves (none, owner, one group, status,
    /// accelerator), newest and oldest first, first page and later ones, is read in the order of an index
    /// on SQLite (no sort of the matching rows): the indexes are ascending, and read backwards for newest.
    #[tokio::test]
    async fn lists_by_creation_are_read_in_index_order() {
        let dir = std::env::temp_dir().join(format!("trainyard-list-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::connect(&format!("sqlite://{}", dir.join("t.db").display())).await.unwrap();
        let filters = [
            TaskFilter::default(),
            TaskFilter { owner: Some("alice".into()), ..Default::default() },
            TaskFilter { project_groups: vec!["nlp".into()], ..Default::default() },
            TaskFilter { status: Some(Status::Queued), ..Default::default() },
            TaskFilter { accelerator: Some(Accelerator::Gpu), ..Default::default() },
            TaskFilter { search: Some("resnet".into()), ..Default::default() },
        ];
        let mut checked = 0;
        for filter in filters {
            for sort in [SortOrder::Newest, SortOrder::Oldest] {
                for cursor in [None, Some("1700000000000.t-1")] {
                    let filter = TaskFilter { sort, ..filter.clone() };
                    let search = filter.search.as_deref().map_or(Search::None, Search::Substring);
                    let (sql, args) = list_query(&filter, cursor, 50, search).unwrap();
                    let rows = bind_all(sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}")), &args)
                        .fetch_all(&store.pool)
                        .await
                        .unwrap();
                    let plan: Vec<String> = rows.iter().map(|r| sqlx::Row::get::<String, _>(r, 3)).collect();
                    assert!(plan.iter().any(|step| step.contains("INDEX")), "{sql}: {plan:?}");
                    assert!(!plan.iter().any(|step| step.contains("TEMP B-TREE")), "{sql}: {plan:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 24);
        drop(store);
        std::fs::remove_dir_all(&dir).ok();
    }
}
