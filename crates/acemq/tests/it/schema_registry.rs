//! `ConfluentRegistry` against a small HTTP server speaking the Confluent Schema Registry
//! REST subset the client uses (register by content, fetch by id), and `RegisteredAvro`
//! over it: idempotent registration, caches both ways (counted on the server), unknown ids,
//! percent-encoded subjects, and decoding a body whose schema is not cached yet.
//!
//! Run: `cargo test -p acemq --features schema-registry --test schema_registry`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use acemq::codec::registry::{ConfluentRegistry, RegistryError, SchemaRegistry};
use acemq::codec::{Decoder, Encoder, RegisteredAvro};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

/// The fake registry's state: schemas by id, the subjects seen, and request counts.
#[derive(Default)]
struct Fake {
    schemas: Mutex<Vec<String>>,
    subjects: Mutex<Vec<String>>,
    posts: AtomicUsize,
    gets: AtomicUsize,
}

async fn register(
    State(fake): State<Arc<Fake>>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    fake.posts.fetch_add(1, Ordering::SeqCst);
    fake.subjects.lock().unwrap().push(subject);
    let Some(schema) = body["schema"].as_str() else {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error_code": 42201, "message": "Invalid schema"})),
        ));
    };
    let mut schemas = fake.schemas.lock().unwrap();
    let index = match schemas.iter().position(|s| s == schema) {
        Some(i) => i,
        None => {
            schemas.push(schema.to_owned());
            schemas.len() - 1
        }
    };
    Ok(Json(json!({ "id": index + 100 })))
}

async fn by_id(
    State(fake): State<Arc<Fake>>,
    Path(id): Path<usize>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    fake.gets.fetch_add(1, Ordering::SeqCst);
    let schemas = fake.schemas.lock().unwrap();
    match id.checked_sub(100).and_then(|i| schemas.get(i)) {
        Some(s) => Ok(Json(json!({ "schema": s }))),
        None => Err((
            StatusCode::NOT_FOUND,
            Json(json!({"error_code": 40403, "message": "Schema not found"})),
        )),
    }
}

/// Starts the fake registry on an ephemeral port; returns its base URL and state.
async fn fake_registry() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/subjects/{subject}/versions", post(register))
        .route("/schemas/ids/{id}", get(by_id))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), fake)
}

const LONG: &str = r#""long""#;
const ORDER: &str = r#"{"type":"record","name":"O","fields":[{"name":"id","type":"string"}]}"#;

#[tokio::test]
async fn registration_is_idempotent_and_cached_both_ways() {
    let (url, fake) = fake_registry().await;
    let client = ConfluentRegistry::new(&url).unwrap();
    let id = client.register("orders-value", ORDER).await.unwrap();
    assert_eq!(client.register("orders-value", ORDER).await.unwrap(), id);
    assert_eq!(
        fake.posts.load(Ordering::SeqCst),
        1,
        "second register cached"
    );
    // A schema this client registered is known by id without asking.
    assert_eq!(&*client.schema(id).await.unwrap(), ORDER);
    assert_eq!(fake.gets.load(Ordering::SeqCst), 0);

    // Another client: the server's answer is idempotent by content.
    let other = ConfluentRegistry::new(&format!("{url}/")).unwrap();
    assert_eq!(other.register("orders-value", ORDER).await.unwrap(), id);
    assert_ne!(other.register("n-value", LONG).await.unwrap(), id);
    // Fetch by id: once over HTTP, then from the cache.
    let third = ConfluentRegistry::new(&url).unwrap();
    assert_eq!(&*third.schema(id).await.unwrap(), ORDER);
    assert_eq!(&*third.schema(id).await.unwrap(), ORDER);
    assert_eq!(fake.gets.load(Ordering::SeqCst), 1, "fetch by id cached");
}

#[tokio::test]
async fn unknown_ids_odd_subjects_and_no_server_are_clear_errors() {
    let (url, fake) = fake_registry().await;
    let client = ConfluentRegistry::new(&url).unwrap();
    assert!(matches!(
        client.schema(4242).await,
        Err(RegistryError::UnknownId { id: 4242 })
    ));
    client.register("a/b value", LONG).await.unwrap();
    assert_eq!(fake.subjects.lock().unwrap().as_slice(), ["a/b value"]);

    let unbound = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", unbound.local_addr().unwrap());
    drop(unbound);
    let dead = ConfluentRegistry::new(&dead_url).unwrap();
    let e = dead.register("s", LONG).await.unwrap_err();
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("check the URL"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_fetches_an_uncached_writer_schema_over_rest() {
    let (url, fake) = fake_registry().await;
    let writer = RegisteredAvro::new(Arc::new(ConfluentRegistry::new(&url).unwrap()), "o", ORDER)
        .await
        .unwrap();
    let body = writer.encode(&json!({"id": "o-1"})).unwrap();
    assert_eq!(body[0], 0);
    assert_eq!(
        u32::from_be_bytes([body[1], body[2], body[3], body[4]]),
        100
    );

    let reader = RegisteredAvro::reader(Arc::new(ConfluentRegistry::new(&url).unwrap()));
    for _ in 0..3 {
        let v: Value = reader
            .decode(Some("application/vnd.acemq.avro"), &body)
            .unwrap();
        assert_eq!(v, json!({"id": "o-1"}));
    }
    assert_eq!(
        fake.gets.load(Ordering::SeqCst),
        1,
        "the schema was fetched once"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_preload_first() {
    let (url, _fake) = fake_registry().await;
    let writer = RegisteredAvro::new(Arc::new(ConfluentRegistry::new(&url).unwrap()), "n", LONG)
        .await
        .unwrap();
    let body = writer.encode(&5_i64).unwrap();
    let reader = RegisteredAvro::reader(Arc::new(ConfluentRegistry::new(&url).unwrap()));
    let e = Decoder::<i64>::decode(&reader, None, &body).unwrap_err();
    assert!(e.to_string().contains("preload"), "{e}");
    reader.preload(&[100]).await.unwrap();
    assert_eq!(Decoder::<i64>::decode(&reader, None, &body).unwrap(), 5);
}
