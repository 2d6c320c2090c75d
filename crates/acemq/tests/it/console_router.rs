//! The operator console (`acemq::console`) over HTTP on `memory://`: escaping of what a
//! message carries, the CSRF token, the dry run → confirm → job flow (counts checked on
//! the queues), a read-only console refusing every POST, and the token gate. The same
//! console in a real browser against RabbitMQ is acemq-cli's `console_browser` test.

use std::net::SocketAddr;
use std::time::Duration;

use acemq::Connection;
use acemq::console::{Console, ConsoleError};
use acemq::envelope::Envelope;
use acemq::headers::HeaderValue;
use acemq::topology::QueueDecl;
use acemq::transport::{Outbound, Properties};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SCRIPT: &str = "<script>alert(1)</script>";

/// One HTTP/1.1 exchange: status, raw header block, body.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> (u16, String, String) {
    let io = async {
        let mut s = TcpStream::connect(addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n{extra}\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .expect("the console answered within 10 s")
        .expect("HTTP exchange");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

async fn dead_letter(
    mq: &Connection,
    q: &str,
    id: &str,
    mtype: &str,
    reason: &str,
    note: Option<&str>,
) {
    let mut props = Properties {
        message_id: Some(id.into()),
        content_type: Some("application/json".into()),
        ..Default::default()
    };
    Envelope::new(mtype)
        .with_id(id)
        .with_attempt(3)
        .with_error(Some(reason.to_owned()))
        .write(&mut props.headers, "test@host");
    if let Some(n) = note {
        props.headers.insert("x-note".into(), HeaderValue::from(n));
    }
    let body = match note {
        Some(n) => format!("not json {n}").into_bytes(),
        None => br#"{"order":1}"#.to_vec(),
    };
    let out = Outbound::new("", format!("{q}.dlq"), props, body);
    mq.transport().publish(out).await.unwrap().await.unwrap();
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_escapes_confirms_and_refuses() {
    let mq = Connection::connect(&format!("memory://console-{}", uuid::Uuid::new_v4()))
        .await
        .unwrap();
    let q = "orders";
    for name in [q.to_owned(), format!("{q}.dlq"), format!("{q}.parked")] {
        mq.transport()
            .declare_queue(&QueueDecl::classic(&name))
            .await
            .unwrap();
    }
    dead_letter(&mq, q, "a-1", "order.placed", "bank timed out", None).await;
    dead_letter(&mq, q, "a-2", "order.placed", "bank timed out", None).await;
    dead_letter(&mq, q, "b-1", "order.paid", "card declined", Some(SCRIPT)).await;

    let console = Console::builder(&mq)
        .queues([q])
        .allow_mutations(true)
        .bind(loopback())
        .serve()
        .await
        .unwrap();
    let addr = console.local_addr();

    // Groups, and a header carrying a script shown as text.
    let (status, _, page) = http(addr, "GET", "/acemq-console/q/orders", "", "").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("bank timed out") && page.contains("card declined"),
        "{page}"
    );
    let (_, _, detail) = http(
        addr,
        "GET",
        "/acemq-console/q/orders/m/b-1?from=dlq",
        "",
        "",
    )
    .await;
    assert!(
        detail.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{detail}"
    );
    assert!(
        detail.contains("not json &lt;script&gt;"),
        "the body too: {detail}"
    );
    assert!(!detail.contains(SCRIPT), "a header or body is never markup");

    // The CSRF token is required; a dry run counts and moves nothing.
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a CSRF token in the page")
        .to_owned();
    let (status, _, _) = http(
        addr,
        "POST",
        "/acemq-console/q/orders/dry-run",
        "",
        "action=replay&reason=timed&csrf=wrong",
    )
    .await;
    assert_eq!(status, 403);
    let form = format!("action=replay&from=dlq&reason=timed&csrf={csrf}");
    let (status, _, dry) = http(addr, "POST", "/acemq-console/q/orders/dry-run", "", &form).await;
    assert_eq!(status, 200, "{dry}");
    assert!(dry.contains("id=\"dry-count\">2<"), "{dry}");
    assert_eq!(mq.replay(q).pending().await.unwrap(), 3);

    // The confirmed pass: a job that moves exactly the two.
    let (status, head, _) = http(
        addr,
        "POST",
        "/acemq-console/q/orders/run",
        "",
        &format!("{form}&confirm=2"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let job = head
        .lines()
        .find_map(|l| l.strip_prefix("location: "))
        .expect("a redirect to the job")
        .to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, page) = http(addr, "GET", &job, "", "").await;
        if page.contains("id=\"status\">done<") {
            assert!(page.contains("id=\"moved\">2<"), "{page}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job did not finish: {page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let source = mq.transport().inspect_queue(q).await.unwrap().message_count;
    assert_eq!((source, mq.replay(q).pending().await.unwrap()), (2, 1));
    console.shutdown().await;

    // Read-only: every POST refused, nothing moved.
    let ro = Console::builder(&mq)
        .queues([q])
        .bind(loopback())
        .serve()
        .await
        .unwrap();
    let (status, _, _) = http(
        ro.local_addr(),
        "POST",
        "/acemq-console/q/orders/run",
        "",
        &format!("{form}&confirm=1"),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(mq.replay(q).pending().await.unwrap(), 1);
    ro.shutdown().await;

    // The token gate, and no non-loopback bind without a token.
    let t = Console::builder(&mq)
        .queues([q])
        .token("s3cret")
        .bind(loopback())
        .serve()
        .await
        .unwrap();
    let a = t.local_addr();
    assert_eq!(http(a, "GET", "/acemq-console/", "", "").await.0, 401);
    assert_eq!(
        http(
            a,
            "GET",
            "/acemq-console/",
            "Authorization: Bearer nope\r\n",
            ""
        )
        .await
        .0,
        401
    );
    assert_eq!(
        http(
            a,
            "GET",
            "/acemq-console/",
            "Authorization: Bearer s3cret\r\n",
            ""
        )
        .await
        .0,
        200
    );
    let (status, head, _) = http(a, "GET", "/acemq-console/?token=s3cret", "", "").await;
    assert_eq!(status, 303);
    assert!(head.contains("HttpOnly; SameSite=Strict"), "{head}");
    assert_eq!(
        http(
            a,
            "GET",
            "/acemq-console/",
            "Cookie: acemq_console=s3cret\r\n",
            ""
        )
        .await
        .0,
        200
    );
    t.shutdown().await;
    let open = Console::builder(&mq)
        .bind("0.0.0.0:0".parse().unwrap())
        .serve()
        .await;
    assert!(
        matches!(open, Err(ConsoleError::TokenRequired { .. })),
        "{open:?}"
    );
}
