//! The `/acemq-info` document.

use serde::Serialize;

/// The library's name in `/acemq-info`.
pub const LIBRARY: &str = "acemq-rust";

/// What an application is called in `/acemq-info` until it says
/// ([`InfoDoc::application`], [`ActuatorBuilder::application`](super::ActuatorBuilder::application)).
pub const UNKNOWN: &str = "unknown";

/// What `/acemq-info` answers (wire contract §9): the library's name and version, the
/// **application's** name and version as configured, the transport (`rabbitmq` or
/// `memory`) and the capabilities.
///
/// ```
/// let info = acemq::actuator::InfoDoc::new("amqp", vec!["confirms".into()])
///     .application("billing", "2.4.1");
/// let json = serde_json::to_value(&info).unwrap();
/// assert_eq!(json["library"], "acemq-rust");
/// assert_eq!(json["libraryVersion"], env!("CARGO_PKG_VERSION"));
/// assert_eq!(json["name"], "billing");
/// assert_eq!(json["version"], "2.4.1");
/// assert_eq!(json["transport"], "rabbitmq");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct InfoDoc {
    /// Always `acemq-rust`.
    pub library: String,
    /// This crate's version.
    #[serde(rename = "libraryVersion")]
    pub library_version: String,
    /// The application's name (`unknown` until set; the connection's name when built by
    /// `Actuator::for_connection`).
    pub name: String,
    /// The application's version (`unknown` until set).
    pub version: String,
    /// `rabbitmq` or `memory` (a transport kind `amqp` is written `rabbitmq`).
    pub transport: String,
    /// What the transport and configuration offer (free-form names).
    pub capabilities: Vec<String>,
}

impl InfoDoc {
    /// The library's name and version with a transport and its capabilities; the
    /// application is `unknown` until [`InfoDoc::application`].
    pub fn new(transport: impl Into<String>, capabilities: Vec<String>) -> Self {
        let transport = transport.into();
        let transport = match transport.as_str() {
            "amqp" | "amqps" => crate::observe::TRANSPORT_RABBITMQ.to_owned(),
            _ => transport,
        };
        InfoDoc {
            library: LIBRARY.into(),
            library_version: env!("CARGO_PKG_VERSION").into(),
            name: UNKNOWN.into(),
            version: UNKNOWN.into(),
            transport,
            capabilities,
        }
    }

    /// The application's name and version (typically
    /// `env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")` in the application's crate).
    pub fn application(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.name = name.into();
        self.version = version.into();
        self
    }
}

impl Default for InfoDoc {
    fn default() -> Self {
        InfoDoc::new(UNKNOWN, Vec::new())
    }
}
