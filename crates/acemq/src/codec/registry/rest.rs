//! [`ConfluentRegistry`]: the Confluent Schema Registry REST API's register and fetch
//! subset, over `reqwest` (no TLS stack, no default features: plain HTTP, JSON), with
//! caches both ways.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::{RegistryError, SchemaRegistry};

/// The media type the Confluent REST API speaks.
const MEDIA: &str = "application/vnd.schemaregistry.v1+json";

/// A Confluent-compatible schema registry over HTTP:
///
/// - register: `POST {base}/subjects/{subject}/versions` with `{"schema": "…"}`, answered
///   `{"id": n}` (the registry returns the existing id for a schema it already holds);
/// - fetch: `GET {base}/schemas/ids/{id}`, answered `{"schema": "…"}`.
///
/// Both answers are cached for the client's life (ids never change meaning), so a schema is
/// registered once per subject and fetched once per id.
///
/// ```no_run
/// use acemq::codec::registry::{ConfluentRegistry, SchemaRegistry};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = ConfluentRegistry::new("http://localhost:8081")?;
/// let id = registry.register("orders-value", r#""string""#).await?;
/// assert_eq!(&*registry.schema(id).await?, r#""string""#);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ConfluentRegistry {
    base: Url,
    http: reqwest::Client,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    ids: HashMap<(String, Arc<str>), u32>,
    schemas: HashMap<u32, Arc<str>>,
}

#[derive(Serialize)]
struct SchemaBody<'a> {
    schema: &'a str,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
}

impl ConfluentRegistry {
    /// A client for the registry at `base_url` (e.g. `http://registry:8081`).
    ///
    /// ```
    /// use acemq::codec::registry::ConfluentRegistry;
    /// assert!(ConfluentRegistry::new("http://localhost:8081").is_ok());
    /// assert!(ConfluentRegistry::new("not a url").is_err());
    /// ```
    pub fn new(base_url: &str) -> Result<Self, RegistryError> {
        let base = Url::parse(base_url).map_err(|e| RegistryError::Unreachable {
            url: base_url.to_owned(),
            reason: format!("not a URL: {e}"),
        })?;
        if base.cannot_be_a_base() {
            return Err(RegistryError::Unreachable {
                url: base_url.to_owned(),
                reason: "not an http(s) base URL".into(),
            });
        }
        Ok(Self {
            base,
            http: reqwest::Client::new(),
            cache: Mutex::new(Cache::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `base` with `segments` appended, each percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        url: &Url,
    ) -> Result<T, RegistryError> {
        let unreachable = |e: reqwest::Error| RegistryError::Unreachable {
            url: url.to_string(),
            reason: e.to_string(),
        };
        let answer = request
            .header(reqwest::header::ACCEPT, MEDIA)
            .send()
            .await
            .map_err(unreachable)?;
        let status = answer.status();
        if !status.is_success() {
            return Err(RegistryError::Refused {
                url: url.to_string(),
                status: status.as_u16(),
                body: answer.text().await.unwrap_or_default(),
            });
        }
        answer.json::<T>().await.map_err(unreachable)
    }
}

impl SchemaRegistry for ConfluentRegistry {
    fn register<'a>(
        &'a self,
        subject: &'a str,
        schema: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>> {
        Box::pin(async move {
            let key = (subject.to_owned(), Arc::<str>::from(schema));
            if let Some(id) = self.lock().ids.get(&key) {
                return Ok(*id);
            }
            let url = self.url(&["subjects", subject, "versions"]);
            let request = self
                .http
                .post(url.clone())
                .header(reqwest::header::CONTENT_TYPE, MEDIA)
                .body(serde_json::to_vec(&SchemaBody { schema }).unwrap_or_default());
            let IdAnswer { id } = self.call(request, &url).await?;
            let mut cache = self.lock();
            cache.schemas.insert(id, key.1.clone());
            cache.ids.insert(key, id);
            Ok(id)
        })
    }

    fn schema(&self, id: u32) -> BoxFuture<'_, Result<Arc<str>, RegistryError>> {
        Box::pin(async move {
            if let Some(schema) = self.lock().schemas.get(&id) {
                return Ok(schema.clone());
            }
            let url = self.url(&["schemas", "ids", &id.to_string()]);
            let answer: Result<SchemaAnswer, _> = self.call(self.http.get(url.clone()), &url).await;
            let schema: Arc<str> = match answer {
                Ok(a) => Arc::from(a.schema),
                Err(RegistryError::Refused { status: 404, .. }) => {
                    return Err(RegistryError::UnknownId { id });
                }
                Err(e) => return Err(e),
            };
            self.lock().schemas.insert(id, schema.clone());
            Ok(schema)
        })
    }
}
