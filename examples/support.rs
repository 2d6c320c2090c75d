//! What the examples share: where to connect. Each example lives in its own file beside
//! this one; run one with `cargo run -p acemq-examples --example <name>`.
//!
//! ```
//! assert!(acemq_examples::broker_url("doc").starts_with("memory://") || std::env::var("ACEMQ_URL").is_ok());
//! ```

/// `ACEMQ_URL` when set (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`), otherwise an
/// in-process `memory://{name}` broker, so every example runs with no broker at all.
pub fn broker_url(name: &str) -> String {
    std::env::var("ACEMQ_URL").unwrap_or_else(|_| format!("memory://{name}"))
}
