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
    #[error("stored row {id:?} is unreadable: {reason}")]
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
    /// A durable saga's builder refused its definition.
    #[error(transparent)]
    Saga(#[from] acemq::saga::SagaError),
    /// The database failed while a durable saga ran (it could not be reached, a statement
    /// or a commit failed). Nothing is half-applied: each step commits with its log entry,
    /// so the saga stays where its log says.
    #[error(
        "saga {id} was interrupted by the database ({source}); it stays in the saga log and recover() (or spawn_recovery) resumes it once its lease runs out, or resume({id:?}) does at once after that"
    )]
    SagaInterrupted {
        /// The saga's id.
        id: String,
        /// What the database said (a `sqlx::Error`, or a step's error that was one).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another process took the saga over after this one's lease ran out (a step or a
    /// pause outlasted the lease without a renewal getting through); what this process
    /// was doing was rolled back.
    #[error(
        "saga {id} was taken over by another process after this one's lease ran out; it carries on there and this process's step was rolled back (a longer lease() avoids this for slow steps)"
    )]
    SagaTakenOver {
        /// The saga's id.
        id: String,
    },
    /// [`resume`](crate::saga::DurableSaga::resume) found the saga held by another
    /// process whose lease has not run out.
    #[error(
        "saga {id} is being run by {owner} (its lease runs to {lease_until_millis} ms since the epoch); resume it after that, or let recover() do it"
    )]
    SagaBusy {
        /// The saga's id.
        id: String,
        /// Who holds it.
        owner: String,
        /// When its lease runs out (epoch milliseconds).
        lease_until_millis: i64,
    },
    /// No saga of this name with this id is in the table.
    #[error("no saga {saga:?} with id {id:?} in the saga table")]
    SagaNotFound {
        /// The saga's name.
        saga: String,
        /// The id asked for.
        id: String,
    },
    /// The stored saga was started with other steps than this definition has: resuming it
    /// would run the wrong step or compensation.
    #[error(
        "saga {id} was started with the steps {stored:?} but this definition of it has {now:?}; keep the old definition running (under its own name) until its sagas have finished, and give a changed saga a new name"
    )]
    SagaChanged {
        /// The saga's id.
        id: String,
        /// The steps it was started with.
        stored: Vec<String>,
        /// The steps of this definition.
        now: Vec<String>,
    },
}
