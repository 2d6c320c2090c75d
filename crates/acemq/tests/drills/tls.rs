//! The TLS drill's broker: the node `scripts/tls-node.sh` starts (`tls@localhost`, amqps on
//! 127.0.0.1:5691 with `verify_peer` and `fail_if_no_peer_cert`, plain AMQP on 5690 for the
//! drill's operator connection), its `openssl s_server` on 5692 presenting an X.509 v1
//! certificate, and the certificates it generated into
//! `$ACEMQ_TLS_DIR/certs` (default `/tmp/acemq-tls/certs`).

use std::path::PathBuf;

use acemq::transport::amqp::TlsOptions;

/// The TLS node's `rabbitmqctl -n` name.
pub const NODE: &str = "tls@localhost";
/// Its amqps URL (by IP: the server name is given apart when it matters).
pub const AMQPS_URL: &str = "amqps://guest:guest@127.0.0.1:5691/%2f";
/// Its plain AMQP URL (the operator connection: checks and clean-up).
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5690/%2f";
/// A DNS name on the server certificate (besides localhost and 127.0.0.1).
pub const SERVER_NAME: &str = "rabbit.acemq.test";
/// `openssl s_server` presenting the X.509 v1 certificate (signed by the private CA).
pub const V1_URL: &str = "amqps://guest:guest@127.0.0.1:5692/%2f";

/// The generated certificates.
#[derive(Debug)]
pub struct TlsNode {
    dir: PathBuf,
}

impl TlsNode {
    /// The node's certificates, when `scripts/tls-node.sh start` wrote them; `None` (the
    /// drill is skipped) otherwise, unless `ACEMQ_TEST_REQUIRE_BROKER=1`, which panics.
    pub fn from_env() -> Option<TlsNode> {
        let base = std::env::var("ACEMQ_TLS_DIR")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "/tmp/acemq-tls".to_owned());
        let dir = PathBuf::from(base).join("certs");
        if dir.join("ca.pem").is_file() {
            return Some(TlsNode { dir });
        }
        assert!(
            std::env::var("ACEMQ_TEST_REQUIRE_BROKER").as_deref() != Ok("1"),
            "ACEMQ_TEST_REQUIRE_BROKER=1 but {} has no certificates: run scripts/tls-node.sh start",
            dir.display()
        );
        eprintln!(
            "note: no TLS node ({} missing); drill skipped",
            dir.display()
        );
        None
    }

    /// One generated file, as text.
    pub fn read(&self, file: &str) -> String {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    }

    /// The private CA trusted and the drill's client certificate presented (mutual TLS).
    pub fn mutual(&self) -> TlsOptions {
        TlsOptions::default()
            .ca_bundle_pem(self.read("ca.pem"))
            .client_certificate_pem(self.read("client.pem"), self.read("client.key"))
    }

    /// The drill's client certificate, without trusting the private CA.
    pub fn without_ca(&self) -> TlsOptions {
        TlsOptions::default()
            .client_certificate_pem(self.read("client.pem"), self.read("client.key"))
    }

    /// The private CA trusted, a client certificate of a CA the server does not trust.
    pub fn rogue_client(&self) -> TlsOptions {
        TlsOptions::default()
            .ca_bundle_pem(self.read("ca.pem"))
            .client_certificate_pem(self.read("rogue-client.pem"), self.read("rogue-client.key"))
    }

    /// The private CA trusted, no client certificate.
    pub fn no_client_certificate(&self) -> TlsOptions {
        TlsOptions::default().ca_bundle_pem(self.read("ca.pem"))
    }
}
