//! The broker: which one (`--url` / `ACEMQ_URL`), how to show its address without the
//! password, how to connect, and where its management API is.

use std::time::Duration;

use acemq::Connection;
use acemq::connection::ConnectionOptions;
use acemq::transport::recovery::RecoveryPolicy;
use url::Url;

use crate::cli::DEFAULT_URL;
use crate::fail::Failure;
use crate::mgmt::Management;

/// The broker the command talks to.
#[derive(Clone, Debug)]
pub struct Broker {
    url: String,
}

impl Broker {
    /// `--url`, else `ACEMQ_URL` (clap reads both), else the local default.
    pub fn new(url: Option<String>) -> Broker {
        Broker {
            url: url.unwrap_or_else(|| DEFAULT_URL.to_owned()),
        }
    }

    /// The address with the password replaced by `***`.
    pub fn shown(&self) -> String {
        redact(&self.url)
    }

    /// A connection that fails fast instead of redialling (a command is not a service).
    pub async fn connect(&self) -> Result<Connection, Failure> {
        let options = ConnectionOptions::default()
            .name("acemq-cli")
            .connect_timeout(Duration::from_secs(5))
            .recovery(RecoveryPolicy::disabled());
        Connection::connect_with(&self.url, options)
            .await
            .map_err(|e| self.connect_failure(&e))
    }

    /// A connection for a long-running command (`acemq console`): it reconnects after a
    /// broker restart instead of failing, but still fails fast on the first connect.
    pub async fn connect_lasting(&self) -> Result<Connection, Failure> {
        let options = ConnectionOptions::default()
            .name("acemq-console")
            .connect_timeout(Duration::from_secs(5));
        Connection::connect_with(&self.url, options)
            .await
            .map_err(|e| self.connect_failure(&e))
    }

    /// What a failed connect says: a refused login is not "cannot reach".
    fn connect_failure(&self, e: &acemq::Error) -> Failure {
        let text = e.to_string();
        if text.contains("Login was refused") {
            let user = Url::parse(&self.url)
                .map(|u| percent_decode(u.username()))
                .unwrap_or_default();
            return Failure::error(format!(
                "the broker at {} refused the login of user {:?}: check the user name and password in --url or ACEMQ_URL",
                self.shown(),
                if user.is_empty() {
                    "guest".to_owned()
                } else {
                    user
                }
            ));
        }
        Failure::error(format!(
            "cannot reach the broker at {}: {text} (set --url or ACEMQ_URL)",
            self.shown()
        ))
    }

    /// The management API: `--management-url` when given (its own credentials, or the
    /// AMQP URL's), else `http://<broker host>:15672`, always for the AMQP URL's vhost.
    pub fn management(&self, explicit: Option<&str>) -> Result<Management, Failure> {
        let amqp = Url::parse(&self.url)
            .map_err(|e| Failure::usage(format!("--url {}: {e}", self.shown())))?;
        let user = percent_decode(amqp.username());
        let user = if user.is_empty() {
            "guest".into()
        } else {
            user
        };
        let password = amqp
            .password()
            .map(percent_decode)
            .unwrap_or_else(|| "guest".into());
        // amqp://host/%2f -> "/"; amqp://host -> "/" (RabbitMQ's default vhost).
        let vhost = match amqp.path() {
            "" | "/" => "/".to_owned(),
            p => percent_decode(&p[1..]),
        };
        let base = match explicit {
            Some(url) => Url::parse(url)
                .map_err(|e| Failure::usage(format!("--management-url {}: {e}", redact(url))))?,
            None => {
                let host = amqp.host_str().unwrap_or("127.0.0.1");
                let host = if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]")
                } else {
                    host.to_owned()
                };
                Url::parse(&format!("http://{host}:15672"))
                    .map_err(|e| Failure::usage(format!("management URL for {host}: {e}")))?
            }
        };
        let (user, password) = match (base.username(), base.password()) {
            ("", _) => (user, password),
            (u, p) => (percent_decode(u), p.map(percent_decode).unwrap_or_default()),
        };
        let mut shown = base.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        Ok(Management::new(
            shown.as_str().trim_end_matches('/').to_owned(),
            user,
            password,
            vhost,
        ))
    }
}

/// An address without its password (`amqp://guest:***@host:5672/vhost`).
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        // Not a URL we can parse: drop everything between the scheme and the last '@'.
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
            _ => url.to_owned(),
        },
    }
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            redact("amqp://app:s3cret@mq.internal:5672/%2f"),
            "amqp://app:***@mq.internal:5672/%2f"
        );
        assert_eq!(redact("amqp://mq:5672"), "amqp://mq:5672");
        assert!(!redact("not a url://u:pw@x").contains("pw"));
    }

    #[test]
    fn the_management_api_follows_the_broker() {
        let b = Broker::new(Some("amqp://app:p%40ss@mq.internal:5672/orders".into()));
        let m = b.management(None).unwrap();
        assert_eq!(m.base(), "http://mq.internal:15672");
        assert_eq!(m.vhost(), "orders");
        assert_eq!(m.user(), "app");
        let m = Broker::new(None)
            .management(Some("http://admin:pw@ops:15672/"))
            .unwrap();
        assert_eq!(
            (m.base(), m.vhost(), m.user()),
            ("http://ops:15672", "/", "admin")
        );
    }
}
