//! RabbitMQ's management HTTP API: the facts AMQP cannot give (which queues exist, unacked
//! counts, a queue's real arguments, bindings). Read-only; blocking (ureq), called from
//! async code through `block_in_place`.

use std::time::Duration;

use base64::Engine as _;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use serde_json::{Map, Value};
use ureq::Agent;

/// A client for one vhost of the management API.
#[derive(Clone)]
pub struct Management {
    base: String,
    user: String,
    auth: String,
    vhost: String,
    agent: Agent,
}

impl std::fmt::Debug for Management {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Management")
            .field("base", &self.base)
            .field("user", &self.user)
            .field("vhost", &self.vhost)
            .finish_non_exhaustive()
    }
}

/// One queue as the management API reports it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct QueueStat {
    /// Name.
    pub name: String,
    /// Ready messages.
    #[serde(default)]
    pub messages_ready: u64,
    /// Delivered, not yet acked.
    #[serde(default)]
    pub messages_unacknowledged: u64,
    /// `classic`, `quorum`, `stream`.
    #[serde(default, rename = "type")]
    pub queue_type: Option<String>,
    /// Durable.
    #[serde(default)]
    pub durable: bool,
    /// Its declared arguments.
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

/// One queue with its consumers and rates (what the console lists).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LiveQueue {
    /// Name.
    pub name: String,
    /// Ready messages.
    #[serde(default)]
    pub messages_ready: u64,
    /// Delivered, not yet acked.
    #[serde(default)]
    pub messages_unacknowledged: u64,
    /// Consumers attached.
    #[serde(default)]
    pub consumers: u64,
    /// `classic`, `quorum`, `stream`.
    #[serde(default, rename = "type")]
    pub queue_type: Option<String>,
    /// Publish and deliver rates, when the broker has them.
    #[serde(default)]
    pub message_stats: Option<MessageStats>,
}

/// A queue's message rates.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct MessageStats {
    /// Publishes.
    #[serde(default)]
    pub publish_details: Option<Rate>,
    /// Deliveries and gets.
    #[serde(default)]
    pub deliver_get_details: Option<Rate>,
}

/// One rate.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct Rate {
    /// Per second.
    #[serde(default)]
    pub rate: f64,
}

/// One binding as the management API reports it.
#[derive(Clone, Debug, Deserialize)]
pub struct BindingStat {
    /// The exchange.
    pub source: String,
    /// The binding key.
    #[serde(default)]
    pub routing_key: String,
    /// Binding arguments.
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

impl Management {
    /// A client for `base` (no trailing slash, no credentials) and `vhost`.
    pub fn new(base: String, user: String, password: String, vhost: String) -> Management {
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let agent: Agent = Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        Management {
            base,
            user,
            auth,
            vhost,
            agent,
        }
    }

    /// The API's address (without credentials).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The vhost asked about.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// The user it logs in as.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Every queue of the vhost.
    pub fn queues(&self) -> Result<Vec<QueueStat>, String> {
        let path = format!(
            "/api/queues/{}?columns=name,messages_ready,messages_unacknowledged,type,durable,arguments",
            enc(&self.vhost)
        );
        self.get(&path)?
            .ok_or_else(|| format!("vhost {} not found", self.vhost))
    }

    /// Every queue of the vhost with its consumers and rates.
    pub fn live_queues(&self) -> Result<Vec<LiveQueue>, String> {
        let path = format!(
            "/api/queues/{}?columns=name,messages_ready,messages_unacknowledged,consumers,type,message_stats.publish_details.rate,message_stats.deliver_get_details.rate",
            enc(&self.vhost)
        );
        self.get(&path)?
            .ok_or_else(|| format!("vhost {} not found", self.vhost))
    }

    /// One queue, `None` when it does not exist.
    pub fn queue(&self, name: &str) -> Result<Option<QueueStat>, String> {
        self.get(&format!("/api/queues/{}/{}", enc(&self.vhost), enc(name)))
    }

    /// The bindings from `exchange` to `queue` (empty when there are none).
    pub fn bindings(&self, exchange: &str, queue: &str) -> Result<Vec<BindingStat>, String> {
        let path = format!(
            "/api/bindings/{}/e/{}/q/{}",
            enc(&self.vhost),
            enc(exchange),
            enc(queue)
        );
        Ok(self.get(&path)?.unwrap_or_default())
    }

    /// One exchange's declaration, `None` when it does not exist.
    pub fn exchange(&self, name: &str) -> Result<Option<Value>, String> {
        self.get(&format!(
            "/api/exchanges/{}/{}",
            enc(&self.vhost),
            enc(name)
        ))
    }

    fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<Option<T>, String> {
        let url = format!("{}{path}", self.base);
        let run = || -> Result<Option<T>, String> {
            let mut resp = self
                .agent
                .get(&url)
                .header("Authorization", &self.auth)
                .call()
                .map_err(|e| format!("management API at {} unreachable: {e}", self.base))?;
            let status = resp.status().as_u16();
            if status == 404 {
                return Ok(None);
            }
            if status == 401 {
                return Err(format!(
                    "management API at {} refused user {} (401): give credentials in --url or --management-url",
                    self.base, self.user
                ));
            }
            let body = resp
                .body_mut()
                .read_to_string()
                .map_err(|e| format!("management API at {}: {e}", self.base))?;
            if !(200..300).contains(&status) {
                return Err(format!("management API at {} answered {status}", self.base));
            }
            serde_json::from_str(&body)
                .map(Some)
                .map_err(|e| format!("management API at {}: unexpected answer: {e}", self.base))
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(run)
            }
            _ => run(),
        }
    }
}

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}
