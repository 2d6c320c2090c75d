//! Validated table names: the only thing ever spliced into SQL text.

use crate::Error;

/// A table name that is safe to splice into SQL: `[A-Za-z_][A-Za-z0-9_]{0,62}`, optionally
/// prefixed by one schema of the same form (`schema.table`). Names are used unquoted, so
/// PostgreSQL folds them to lower case.
///
/// ```
/// use acemq_sql::TableName;
/// assert_eq!(TableName::parse("app.acemq_idempotency").unwrap().as_str(), "app.acemq_idempotency");
/// assert!(TableName::parse("x; drop table y").is_err());
/// assert!(TableName::parse("1abc").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    full: String,
    schema: Option<String>,
    table: String,
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    s.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl TableName {
    /// Validates a name; anything else is [`Error::InvalidTableName`].
    pub fn parse(name: &str) -> Result<TableName, Error> {
        let bad = || Error::InvalidTableName {
            name: name.chars().take(100).collect(),
        };
        let (schema, table) = match name.split_once('.') {
            Some((s, t)) => (Some(s), t),
            None => (None, name),
        };
        if !is_ident(table) || schema.is_some_and(|s| !is_ident(s)) {
            return Err(bad());
        }
        Ok(TableName {
            full: name.to_owned(),
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// A constant name known to be valid.
    pub(crate) fn trusted(name: &'static str) -> TableName {
        TableName {
            full: name.to_owned(),
            schema: None,
            table: name.to_owned(),
        }
    }

    /// The name as written in statements (`schema.table` or `table`).
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The table part, without the schema.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The schema part, if any.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// An index name derived from the table's (kept within MySQL's 64-character limit).
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        let keep = 63usize.saturating_sub(suffix.len() + 1);
        let base: String = self.table.chars().take(keep).collect();
        format!("{base}_{suffix}")
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["a", "_x", "acemq_idem_1", "s.t", &"a".repeat(63)] {
            assert!(TableName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1a",
            "a-b",
            "a b",
            "x; drop table",
            "a.b.c",
            ".a",
            "a.",
            "\"a\"",
            "a;",
            &"a".repeat(64),
            "é",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad}");
        }
        let t = TableName::parse(&"a".repeat(63)).unwrap();
        assert!(t.index_name("expires_at").len() <= 63);
    }
}
