//! An axum handler that answers `202 Accepted` only once the broker has confirmed the
//! message (and routed it), and says honestly what went wrong otherwise.
//!
//! ```text
//! cargo run -p acemq-examples --example publish_202             # one request, then exit
//! ACEMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f SERVE=127.0.0.1:8080 \
//!   cargo run -p acemq-examples --example publish_202            # serve until Ctrl-C
//! curl -i -XPOST localhost:8080/orders -H 'content-type: application/json' -d '{"id":"o-1","amount_cents":100}'
//! ```
//!
//! The status codes follow [`acemq::error::ErrorKind`]: `Transient` (connection down or
//! blocked, publishing paused) is `503` with `Retry-After`; `InDoubt` (the confirm did not
//! come back) is `504`: the broker may have the message, so the client retries with the
//! same order id and the consumer deduplicates; `Refused` (unroutable) is `502`; `Invalid`
//! is `400`.

use acemq::Connection;
use acemq::error::ErrorKind;
use acemq::publish::Publisher;
use acemq::topology::{ExchangeKind, Topology};
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

#[derive(Debug, Serialize, Deserialize)]
struct PlaceOrder {
    id: String,
    amount_cents: u64,
}

async fn place_order(
    State(orders): State<Publisher<PlaceOrder>>,
    Json(order): Json<PlaceOrder>,
) -> Response {
    match orders.send(&order).await {
        Ok(sent) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "order": order.id, "messageId": sent.message_id })),
        )
            .into_response(),
        Err(e) => {
            let status = match e.kind() {
                ErrorKind::Transient => StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::InDoubt => StatusCode::GATEWAY_TIMEOUT,
                ErrorKind::Refused => StatusCode::BAD_GATEWAY,
                ErrorKind::Invalid => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = Json(serde_json::json!({ "order": order.id, "error": e.to_string() }));
            if status == StatusCode::SERVICE_UNAVAILABLE {
                (status, [(header::RETRY_AFTER, "5")], body).into_response()
            } else {
                (status, body).into_response()
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mq = Connection::connect(&acemq_examples::broker_url("publish-202")).await?;
    mq.declare(
        &Topology::define()
            .exchange("example.orders", ExchangeKind::Topic)
            .queue_with_dead_letter("example.orders.placed")
            .bind("example.orders.placed", "example.orders", "order.placed")
            .build()?,
    )
    .await?;
    let app = axum::Router::new()
        .route("/orders", post(place_order))
        .with_state(mq.publisher::<PlaceOrder>("example.orders", "order.placed"));

    if let Ok(addr) = std::env::var("SERVE") {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("POST http://{addr}/orders (Ctrl-C stops)");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                tokio::signal::ctrl_c().await.ok();
            })
            .await?;
    } else {
        // One request through the router, as a test would send it.
        let request = axum::http::Request::post("/orders")
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(
                r#"{"id":"o-1","amount_cents":1250}"#,
            ))?;
        let response = app.oneshot(request).await?;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 64 * 1024).await?;
        println!("{status} {}", String::from_utf8_lossy(&body));
        assert_eq!(status, StatusCode::ACCEPTED);
        let waiting = mq
            .transport()
            .inspect_queue("example.orders.placed")
            .await?;
        println!(
            "example.orders.placed holds {} message(s)",
            waiting.message_count
        );
    }
    for q in [
        "example.orders.placed",
        "example.orders.placed.dlq",
        "example.orders.placed.parked",
    ] {
        mq.transport().delete_queue(q).await?;
    }
    mq.transport().delete_exchange("example.orders").await?;
    mq.close().await?;
    Ok(())
}
