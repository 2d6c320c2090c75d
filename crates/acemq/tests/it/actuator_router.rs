//! `acemq::actuator::router(&connection)` mounted into an application's own axum app: the
//! three endpoints answer for the connection beside the application's routes, on
//! `memory://` and RabbitMQ, and the app's own fallback stays in charge of other paths.

use crate::http_client;
use crate::support;

use std::net::SocketAddr;

use acemq::Connection;
use acemq::actuator::{Actuator, router};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use support::{Broker, on_each_target};

/// Serves `app` on a free port until the returned sender is dropped.
async fn serve(app: Router) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
            .ok();
    });
    (addr, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_mounts_beside_the_applications_routes() {
    on_each_target(|target: Broker| async move {
        let transport = match target {
            Broker::Memory(_) => "memory",
            Broker::Amqp(_) => "rabbitmq",
        };
        let mq = Connection::connect(&target.url()).await.expect("connect");
        let app = Router::new()
            .route("/orders", get(|| async { "orders here" }))
            // A fallback set before the merge: merging a router that had one too would
            // panic.
            .fallback(|| async { (StatusCode::IM_A_TEAPOT, "the app's own fallback") })
            .merge(router(&mq));
        let (addr, stop) = serve(app).await;

        let own = http_client::get(addr, "/orders").await;
        assert_eq!((own.status, own.body.as_str()), (200, "orders here"));

        let h = http_client::get(addr, "/acemq-health").await;
        assert_eq!(h.status, 200, "{}", h.body);
        let doc = h.json();
        assert_eq!(doc["status"], "UP");
        assert_eq!(
            doc["components"]["acemq"]["details"]["transport"],
            transport
        );
        assert_eq!(doc["components"]["acemq"]["details"]["open"], true);
        assert_eq!(doc["components"]["acemq"]["details"]["inFlight"], 0);

        let info = http_client::get(addr, "/acemq-info").await.json();
        assert_eq!(info["transport"], transport);
        assert_eq!(info["name"], "acemq", "the connection's name by default");
        assert_eq!(info["version"], "unknown");

        let m = http_client::get(addr, "/acemq-metrics").await;
        assert_eq!(m.status, 200);
        assert!(
            m.header("content-type")
                .is_some_and(|c| c.starts_with("text/plain; version=0.0.4"))
        );

        let other = http_client::get(addr, "/nothing-here").await;
        assert_eq!(
            (other.status, other.body.as_str()),
            (418, "the app's own fallback"),
            "the actuator's router brings no fallback of its own"
        );

        // Down answers 503 through the mounted router too.
        mq.close_now().await.expect("close");
        let h = http_client::get(addr, "/acemq-health").await;
        assert_eq!(h.status, 503, "{}", h.body);
        assert_eq!(h.json()["components"]["acemq"]["details"]["open"], false);
        drop(stop);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builders_router_carries_the_applications_name_and_version() {
    let mq = Connection::connect(&format!("memory://{}", support::unique("router-app")))
        .await
        .expect("connect");
    let app = Router::new().nest(
        "/ops",
        Actuator::for_connection(&mq)
            .application("billing", "2.4.1")
            .router(),
    );
    let (addr, stop) = serve(app).await;
    let info = http_client::get(addr, "/ops/acemq-info").await.json();
    assert_eq!(info["name"], "billing");
    assert_eq!(info["version"], "2.4.1");
    assert_eq!(info["libraryVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        http_client::get(addr, "/ops/acemq-health").await.json()["status"],
        "UP"
    );
    drop(stop);
    mq.close().await.expect("close");
}
