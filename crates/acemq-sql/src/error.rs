//! The crate's error type.

/// What can go wrong outside the [`acemq::idempotency::IdempotencyStore`] methods (those
/// answer with [`acemq::idempotency::StoreError`]).
///
/// ```
/// let e = acemq_sql::TableName::parse("x; drop table y").unwrap_err();
/// assert!(matches!(e, acemq_sql::Error::InvalidTableName { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused a statement or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A table name that is not a plain SQL identifier.
    #[error(
        "invalid table name {name:?}: use letters, digits and underscores, starting with a letter or underscore, at most 63 characters, optionally prefixed by one `schema.`"
    )]
    InvalidTableName {
        /// The refused name.
        name: String,
    },
    /// The message could not be built (encoding, reserved header, bad option).
    #[error("could not prepare the message: {0}")]
    Prepare(#[from] acemq::Error),
    /// An argument was out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A stored row could not be read back (for example its headers are not valid JSON).
    #[error("stored outbox row {id:?} is unreadable: {reason}")]
    CorruptRow {
        /// The row's id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The idempotency table has the schema of acemq-sql before 0.2 (`BIGINT` epoch
    /// milliseconds) instead of the family's timestamps.
    #[error(
        "the idempotency table {table} has the old acemq-sql schema (expires_at is {found}, epoch milliseconds); Java's DDL uses TIMESTAMP WITH TIME ZONE (DATETIME(3) on MySQL/MariaDB): migrate it with the SQL in docs/idempotency.md, \"Migrating a table from the BIGINT schema\""
    )]
    IncompatibleSchema {
        /// The table.
        table: String,
        /// The type found for `expires_at`.
        found: String,
    },
    /// [`SqlIdempotencyStore::confirm_in`](crate::SqlIdempotencyStore::confirm_in) found no
    /// claim of this store's on the key: it was taken over after its lease ran out (or
    /// confirmed, or released). Roll the transaction back; the message is handled by
    /// whoever holds it now.
    #[error(
        "this store no longer holds the idempotency claim on {key:?} (its lease ran out and it was taken over, or it was confirmed or released); roll the transaction back"
    )]
    ClaimLost {
        /// The idempotency key (the envelope id).
        key: String,
    },
    /// The relay is already running.
    #[error("the outbox relay is already running; stop() it before starting it again")]
    AlreadyRunning,
}
