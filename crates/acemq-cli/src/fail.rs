//! Exit codes and the one error type every command returns.

use std::process::ExitCode;

/// Done; health UP; no drift.
pub const OK: u8 = 0;
/// Partial: health DEGRADED, drift or missing items, some messages not moved.
pub const PARTIAL: u8 = 1;
/// Error: health DOWN or unreachable, broker unreachable, a command failed.
pub const ERROR: u8 = 2;
/// Bad usage (sysexits' EX_USAGE), including a purge refused without `--yes`.
pub const USAGE: u8 = 64;

/// Why a command stopped, and the exit code that says so.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// What happened and what to do, for stderr.
    pub message: String,
}

impl Failure {
    /// Exit 2 with this message.
    pub fn error(message: impl Into<String>) -> Failure {
        Failure {
            code: ERROR,
            message: message.into(),
        }
    }

    /// Exit 64 with this message.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: USAGE,
            message: message.into(),
        }
    }
}

impl From<acemq::Error> for Failure {
    fn from(e: acemq::Error) -> Failure {
        Failure::error(e.to_string())
    }
}

/// What a command ended with: an exit code (its output is already written).
pub type Outcome = Result<u8, Failure>;

/// The process exit code for an outcome, printing a failure to stderr.
pub fn exit(outcome: Outcome) -> ExitCode {
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("acemq: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// As [`exit`]; with `--json` the failure is also one JSON document on stdout
/// (`{"error": …, "exit_code": …}`), so a script reading stdout always gets JSON.
pub fn exit_as(outcome: Outcome, json: bool) -> ExitCode {
    if json && let Err(f) = &outcome {
        println!(
            "{}",
            serde_json::json!({ "error": f.message, "exit_code": f.code })
        );
    }
    exit(outcome)
}
