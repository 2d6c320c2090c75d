//! `amqps://` connections: the rustls connector built from [`TlsOptions`] (the dial itself,
//! TCP then TLS verifying a name that can differ from the URL's host, is
//! [`super::socket::connect`]'s), and TLS failures told apart from an unreachable broker.
//!
//! A handshake failure reaches us as lapin's I/O error around an [`std::io::Error`] around
//! the [`rustls::Error`]; [`classify`] finds that rustls error in the chain and sorts it
//! into a [`TlsFailure`]. A server that refuses the client certificate says so with an alert,
//! which with TLS 1.3 arrives after the client finished its half of the handshake, on the
//! first read: it is in the same chain.

use std::io;

use lapin::tcp::{RustlsConnector, RustlsConnectorConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError};

use super::TlsOptions;
use crate::transport::{TlsFailure, TransportError};

/// Builds the rustls connector: the system's roots, the extra CA bundle, the client
/// certificate. Unusable PEM is a configuration error (never retried).
pub(crate) fn connector(tls: &TlsOptions) -> Result<RustlsConnector, TransportError> {
    let config_error = |what: &str, e: &dyn std::fmt::Display| TransportError::Config {
        detail: format!("TLS: {what}: {e}"),
    };
    let mut config = RustlsConnectorConfig::new_with_native_certs()
        .map_err(|e| config_error("cannot load the system's CA certificates", &e))?;
    if let Some(bundle) = &tls.ca_bundle {
        let certs = CertificateDer::pem_slice_iter(bundle.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                config_error("the CA bundle (TlsOptions::ca_bundle_pem) is not PEM", &e)
            })?;
        if certs.is_empty() {
            return Err(TransportError::Config {
                detail: "TLS: the CA bundle (TlsOptions::ca_bundle_pem) holds no certificate"
                    .to_owned(),
            });
        }
        config.add_parsable_certificates(certs);
    }
    let connector = match &tls.client {
        Some((pem, key)) => {
            let chain = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| config_error("the client certificate is not PEM", &e))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| config_error("the client key is not a PEM private key", &e))?;
            config
                .connector_with_single_cert(chain, key)
                .map_err(|e| config_error("the client certificate cannot be used", &e))?
        }
        None => config
            .connector_with_no_client_auth()
            .map_err(|e| config_error("cannot build the TLS configuration", &e))?,
    };
    Ok(connector)
}

/// The rustls error somewhere in `error`'s source chain (looking inside [`io::Error`]s,
/// whose `source()` skips the error they wrap).
fn find_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(r) = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(r);
        }
        next = e.source();
    }
    None
}

/// Sorts a rustls error into a [`TlsFailure`].
pub(crate) fn failure_of(error: &rustls::Error) -> TlsFailure {
    match error {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => TlsFailure::UnknownCa,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::NameMismatch
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsFailure::Expired,
            CertificateError::Other(other)
                if other.to_string().contains("UnsupportedCertVersion") =>
            {
                TlsFailure::UnsupportedCertificate
            }
            CertificateError::BadEncoding => TlsFailure::UnsupportedCertificate,
            _ => TlsFailure::Other,
        },
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied,
        ) => TlsFailure::ClientCertificateRefused,
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            TlsFailure::NotTls
        }
        _ => TlsFailure::Other,
    }
}

/// A [`TransportError::Tls`] when `error` is a TLS failure with `address`, else `None`.
pub(crate) fn classify(error: &lapin::Error, address: &str) -> Option<TransportError> {
    let rustls = find_rustls(error)?;
    Some(TransportError::Tls {
        address: address.to_owned(),
        failure: failure_of(rustls),
        detail: rustls.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lapin_io(e: rustls::Error) -> lapin::Error {
        lapin::Error::from(io::Error::new(io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn handshake_failures_are_sorted_and_named() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                TlsFailure::UnknownCa,
                "not signed by a trusted CA",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                TlsFailure::NameMismatch,
                "TlsOptions::server_name",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                TlsFailure::Expired,
                "expired",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                TlsFailure::ClientCertificateRefused,
                "client certificate",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::UnknownCA),
                TlsFailure::ClientCertificateRefused,
                "client certificate",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                    std::sync::Arc::new(io::Error::other("UnsupportedCertVersion")),
                ))),
                TlsFailure::UnsupportedCertificate,
                "X.509 v3",
            ),
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                TlsFailure::NotTls,
                "is the port a TLS listener",
            ),
        ];
        for (rustls_error, failure, phrase) in cases {
            let e = classify(&lapin_io(rustls_error), "127.0.0.1:5671").expect("a TLS error");
            let text = e.to_string();
            assert!(
                matches!(&e, TransportError::Tls { failure: f, .. } if *f == failure),
                "{e:?}"
            );
            assert!(
                text.starts_with("TLS handshake with 127.0.0.1:5671 failed"),
                "{text}"
            );
            assert!(text.contains(phrase), "{text}");
            assert!(super::super::link::permanent(&e), "{e:?}");
            assert_eq!(e.kind(), crate::transport::ErrorKind::Refused);
        }
    }

    #[test]
    fn a_plain_io_error_is_not_a_tls_failure() {
        let e = lapin::Error::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(classify(&e, "127.0.0.1:5671").is_none());
    }

    #[test]
    fn unusable_pem_is_a_configuration_error() {
        let bad_ca = TlsOptions::default().ca_bundle_pem("not a certificate");
        let e = connector(&bad_ca).expect_err("no certificate in the bundle");
        assert!(matches!(e, TransportError::Config { .. }), "{e:?}");
        assert!(e.to_string().contains("ca_bundle_pem"), "{e}");
        assert!(super::super::link::permanent(&e));
        let bad_client = TlsOptions::default().client_certificate_pem("nope", "nope");
        let e = connector(&bad_client).expect_err("no client key");
        assert!(matches!(e, TransportError::Config { .. }), "{e:?}");
    }

    /// The whole dial, no broker needed: `amqps://` to a port that answers in plain AMQP
    /// (what RabbitMQ's 5672 does to a TLS ClientHello) fails at once with `NotTls`, not
    /// after the connect timeout as "could not reach the broker".
    #[tokio::test]
    async fn amqps_to_a_plain_port_fails_at_once_naming_the_cause() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("local addr").port();
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut hello = [0u8; 64];
                let _ = socket.read(&mut hello).await;
                let _ = socket.write_all(b"AMQP\x00\x00\x09\x01").await;
            }
        });
        let options = super::super::AmqpOptions::default()
            .connect_timeout(std::time::Duration::from_secs(20));
        let t0 = std::time::Instant::now();
        let url = format!("amqps://guest:guest@127.0.0.1:{port}/%2f");
        let e = super::super::AmqpTransport::connect_with(&url, options)
            .await
            .expect_err("not a TLS port");
        let took = t0.elapsed();
        server.abort();
        assert!(
            matches!(
                &e,
                TransportError::Tls {
                    failure: TlsFailure::NotTls,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(
            took < std::time::Duration::from_secs(2),
            "took {took:?}: {e}"
        );
    }
}
