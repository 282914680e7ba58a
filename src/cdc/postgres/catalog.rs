//! What the source checks and sets up in the database: the server's
//! settings, the tables (columns, types, keys), the publication and the
//! replication slot.

use std::sync::Arc;

use postgres::Client;

use super::changes::{ColumnInfo, TableInfo};
use super::error::Failure;
use super::lsn::parse_lsn;
use super::types::{PgType, SUPPORTED_TYPES};

/// Quotes an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn get<'a, T: postgres::types::FromSql<'a>>(row: &'a postgres::Row, index: usize) -> Result<T, Failure> {
    row.try_get(index).map_err(|e| Failure::invalid("reading the catalog", e))
}

/// Checks that the server can decode logically.
pub(crate) fn check_server(client: &mut Client) -> Result<(), Failure> {
    let row = client.query_one("SELECT current_setting('wal_level')", &[])?;
    let level: String = get(&row, 0)?;
    if level != "logical" {
        return Err(Failure::config(format!(
            "the server has wal_level = {level}; logical decoding needs wal_level = logical (and a restart)"
        )));
    }
    Ok(())
}

/// Describes the configured tables; fails on a missing table, a column of an
/// unsupported type or a table without a usable key.
pub(crate) fn describe_tables(client: &mut Client, names: &[String]) -> Result<Vec<TableInfo>, Failure> {
    let mut tables = Vec::with_capacity(names.len());
    for name in names {
        let rows = client.query(
            "SELECT c.oid, n.nspname::text, c.relname::text, c.relkind::text, c.relreplident::text \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
            &[name],
        )?;
        let Some(row) = rows.first() else {
            return Err(Failure::config(format!("table {name} does not exist")));
        };
        let (oid, schema, table, kind, identity): (u32, String, String, String, String) =
            (get(row, 0)?, get(row, 1)?, get(row, 2)?, get(row, 3)?, get(row, 4)?);
        let qualified = format!("{schema}.{table}");
        if kind != "r" {
            return Err(Failure::config(format!("{qualified} is not a plain table (relkind {kind})")));
        }
        let mut columns = Vec::new();
        for row in client.query(
            "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), a.attgenerated <> '' \
             FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&oid],
        )? {
            let (column, type_oid, type_name, generated): (String, u32, String, bool) =
                (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?, get(&row, 3)?);
            if generated {
                // Not published by pgoutput: left out of the snapshot too.
                continue;
            }
            let Some(ty) = PgType::from_oid(type_oid) else {
                return Err(Failure::config(format!(
                    "table {qualified}: column {column} has type {type_name}, which the PostgreSQL source does not \
                     support (supported: {SUPPORTED_TYPES})"
                )));
            };
            columns.push(ColumnInfo { name: Arc::from(column.as_str()), ty });
        }
        let index_columns = |client: &mut Client, which: &str| -> Result<Vec<Arc<str>>, Failure> {
            let rows = client.query(
                &format!(
                    "SELECT a.attname::text FROM pg_index i \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                     WHERE i.indrelid = $1 AND i.{which} ORDER BY array_position(i.indkey::int2[], a.attnum)"
                ),
                &[&oid],
            )?;
            rows.iter().map(|r| get::<String>(r, 0).map(|c| Arc::from(c.as_str()))).collect()
        };
        let primary = index_columns(client, "indisprimary")?;
        let key = match identity.as_str() {
            "d" if !primary.is_empty() => primary,
            "i" => index_columns(client, "indisreplident")?,
            "f" if !primary.is_empty() => primary,
            "f" => columns.iter().map(|c| Arc::clone(&c.name)).collect(),
            _ => {
                return Err(Failure::config(format!(
                    "table {qualified} has no primary key (and REPLICA IDENTITY {}): updates and deletes cannot \
                     be keyed; add a primary key or ALTER TABLE {qualified} REPLICA IDENTITY FULL",
                    if identity == "n" { "NOTHING" } else { "DEFAULT" }
                )))
            }
        };
        if key.is_empty() {
            return Err(Failure::config(format!("table {qualified}: no key columns")));
        }
        tables.push(TableInfo { schema, table, name: Arc::from(qualified.as_str()), columns, key });
    }
    Ok(tables)
}

/// Creates the publication for the tables, or adds the tables missing from it.
pub(crate) fn ensure_publication(client: &mut Client, publication: &str, tables: &[TableInfo]) -> Result<(), Failure> {
    let qualified = |t: &TableInfo| format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.table));
    let rows = client
        .query("SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = $1", &[&publication])?;
    let Some(row) = rows.first() else {
        let list: Vec<String> = tables.iter().map(qualified).collect();
        tracing::info!(publication, "creating the publication");
        client.batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {}",
            quote_ident(publication),
            list.join(", ")
        ))?;
        return Ok(());
    };
    let (insert, update, delete): (bool, bool, bool) = (get(row, 0)?, get(row, 1)?, get(row, 2)?);
    if !(insert && update && delete) {
        return Err(Failure::config(format!(
            "publication {publication} does not publish all of inserts, updates and deletes"
        )));
    }
    for table in tables {
        let present = client.query(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &table.schema, &table.table],
        )?;
        if present.is_empty() {
            tracing::info!(publication, table = %table.name, "adding the table to the publication");
            client.batch_execute(&format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote_ident(publication),
                qualified(table)
            ))?;
        }
    }
    Ok(())
}

/// The slot's confirmed position, if the slot exists; fails if it is not a
/// pgoutput slot of this database.
pub(crate) fn slot_position(client: &mut Client, slot: &str) -> Result<Option<u64>, Failure> {
    let rows = client.query(
        "SELECT plugin::text, database = current_database(), confirmed_flush_lsn::text \
         FROM pg_replication_slots WHERE slot_name = $1",
        &[&slot],
    )?;
    let Some(row) = rows.first() else { return Ok(None) };
    let plugin: Option<String> = get(row, 0)?;
    let here: Option<bool> = get(row, 1)?;
    if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
        return Err(Failure::config(format!(
            "replication slot {slot} exists but is not a pgoutput slot of this database (plugin {plugin:?})"
        )));
    }
    let confirmed: Option<String> = get(row, 2)?;
    Ok(Some(confirmed.as_deref().and_then(parse_lsn).unwrap_or(0)))
}

/// Drops the slot if it exists.
pub(crate) fn drop_slot(client: &mut Client, slot: &str) -> Result<(), Failure> {
    if slot_position(client, slot)?.is_some() {
        tracing::info!(slot, "dropping the existing replication slot (a new snapshot is taken)");
        client.execute("SELECT pg_drop_replication_slot($1)", &[&slot])?;
    }
    Ok(())
}

/// Creates a persistent pgoutput slot (in a transaction of its own); returns
/// its consistent point.
pub(crate) fn create_slot(client: &mut Client, slot: &str) -> Result<u64, Failure> {
    let row = client.query_one("SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", &[&slot])?;
    let lsn: String = get(&row, 0)?;
    let lsn = parse_lsn(&lsn).ok_or_else(|| Failure::invalid("creating the slot", format!("bad LSN {lsn:?}")))?;
    tracing::info!(slot, lsn = %super::lsn::format_lsn(lsn), "created the replication slot");
    Ok(lsn)
}
