//! The acemq-cli integration tests: the built `acemq` binary run end to end, one module per
//! command group, in one test binary.

#[path = "../support/mod.rs"]
mod support;

mod console_browser;
mod dlq_cli;
mod health_cli;
mod topology_cli;
mod webdriver;
