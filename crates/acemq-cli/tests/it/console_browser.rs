//! `acemq console` in headless Chromium against RabbitMQ: dead letters of two reasons and
//! a parked message; the groups and counts shown, a filtered dry run, a confirmed replay
//! (checked on the broker, provenance set), a read-only console refusing the POST, a
//! `<script>` header rendered as text, and a token console refusing a page without it.
//! Screenshots go to `$CARGO_TARGET_DIR/console-screenshots/` (else `target/…`).
//!
//! `#[ignore]`d: scripts/test.sh runs it as its own step ("console in headless Chromium"),
//! after installing Debian's `chromium` and `chromium-driver` when missing.

use crate::support;
use crate::webdriver::{Browser, Killed, agent, available, poll};

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use acemq::Connection;
use acemq::topology::{dead_letter_queue, parked_queue};
use acemq::transport::Settlement;
use support::{Seed, amqp_url, declare_dead_lettered, ready, seed};

const TIMEOUT: &str = "payment gateway timed out after 30s";
const DECLINED: &str = "card declined: insufficient funds";
const SCRIPT: &str = "<script>window.__pwned = 1</script>";

/// A running `acemq console` and the address it serves.
struct Served {
    _child: Killed,
    base: String,
}

fn console(url: &str, args: &[&str]) -> Served {
    let mut child = support::acemq(Some(url))
        .arg("console")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acemq console starts");
    let stderr = child.stderr.take().expect("stderr piped");
    let child = Killed(child);
    let mut lines = BufReader::new(stderr).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("acemq console {args:?} said nothing"));
    std::thread::spawn(move || for _ in lines {});
    assert!(
        !first.contains("guest:guest"),
        "the password is never printed: {first}"
    );
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    let port = addr.rsplit(':').next().unwrap_or("0").to_owned();
    Served {
        _child: child,
        base: format!("http://127.0.0.1:{port}/acemq-console"),
    }
}

fn shots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "browser: run by scripts/test.sh's headless Chromium step"]
async fn console_in_headless_chromium() {
    let Some(url) = amqp_url() else { return };
    if !available() {
        return;
    }
    let mq = Connection::connect(&url).await.unwrap();
    let q = support::unique("console");
    let _guard = support::Cleanup::new(&url, &q);
    declare_dead_lettered(&mq, &q).await;
    let t = mq.transport().clone();
    let dlq = dead_letter_queue(&q);
    let parked = parked_queue(&q);
    let placed = seed(
        &t,
        &dlq,
        3,
        &Seed {
            message_type: "order.placed",
            error: TIMEOUT,
            headers: &[],
        },
    )
    .await;
    let paid = seed(
        &t,
        &dlq,
        2,
        &Seed {
            message_type: "order.paid",
            error: DECLINED,
            headers: &[("x-note", SCRIPT)],
        },
    )
    .await;
    seed(
        &t,
        &parked,
        1,
        &Seed {
            message_type: "order.placed",
            error: "body is not JSON",
            headers: &[],
        },
    )
    .await;
    let dir = shots();

    let writable = console(&url, &["--listen", "127.0.0.1:0", "--allow-mutations"]);
    let b = Browser::start();

    // The queues page: the family with 5 dead letters and 1 parked (the management API's
    // figures lag a little: reload until they show).
    poll(
        Duration::from_secs(30),
        "the queues page to show 5 dead letters, 1 parked",
        || {
            b.goto(&format!("{}/", writable.base));
            let row = b.js(&format!(
            "const r = Array.from(document.querySelectorAll('#queues tbody tr')).find(r => r.cells[0].textContent === {:?}); return r ? [r.cells[8].textContent, r.cells[9].textContent] : null",
            q
        ));
            (row == serde_json::json!(["5", "1"])).then_some(())
        },
    );
    b.screenshot(&dir.join("queues.png"));

    // Dead letters grouped by reason and type, with counts matching the queue.
    b.goto(&format!("{}/q/{}", writable.base, enc(&q)));
    let groups = b.js("return Array.from(document.querySelectorAll('#groups tr.group')).map(r => [r.cells[0].textContent, r.cells[1].textContent, r.cells[2].textContent]).sort()");
    assert_eq!(
        groups,
        serde_json::json!([
            [DECLINED, "order.paid", "2"],
            [TIMEOUT, "order.placed", "3"]
        ]),
        "groups"
    );
    assert_eq!(
        b.js("return document.getElementById('pending').textContent"),
        "5"
    );
    assert_eq!(ready(&t, &dlq).await, 5, "looking moved nothing");
    b.screenshot(&dir.join("dead-letters.png"));

    // A `<script>` header is text: shown as written, never run.
    b.goto(&format!(
        "{}/q/{}/m/{}?from=dlq",
        writable.base,
        enc(&q),
        enc(&paid[0])
    ));
    let headers = b.js("return document.getElementById('headers').innerText");
    assert!(headers.as_str().unwrap_or("").contains(SCRIPT), "{headers}");
    assert_eq!(
        b.js("return typeof window.__pwned"),
        "undefined",
        "the header's script ran"
    );
    assert_eq!(
        b.js("return document.querySelectorAll('script').length"),
        1,
        "only console.js"
    );
    b.type_into("#header-filter", "x-note");
    assert_eq!(b.js("return Array.from(document.querySelectorAll('#headers tbody tr')).filter(r => !r.hidden).length"), 1);
    b.screenshot(&dir.join("message.png"));

    // A filtered dry run counts the timeouts only, and moves nothing.
    b.goto(&format!("{}/q/{}", writable.base, enc(&q)));
    b.type_into("form.filter input[name=reason]", "timed out");
    b.click("form.filter button[type=submit]");
    poll(Duration::from_secs(10), "the filtered list", || {
        (b.js("return document.querySelectorAll('#messages tr.msg').length") == 3).then_some(())
    });
    b.click("#actions button[value=replay]");
    let count = poll(Duration::from_secs(20), "the dry run's count", || {
        b.js("const e = document.getElementById('dry-count'); return e ? e.textContent : null")
            .as_str()
            .map(str::to_owned)
    });
    assert_eq!(count, "3", "the dry run counts the 3 timeouts");
    assert!(
        b.text().contains("Replay 3 messages from"),
        "the confirmation names the count"
    );
    assert_eq!(ready(&t, &dlq).await, 5, "a dry run moves nothing");
    b.screenshot(&dir.join("confirm.png"));

    // The confirmed replay moves exactly those three.
    b.click("#confirm-button");
    poll(Duration::from_secs(30), "the replay to finish", || {
        (b.js("const e = document.getElementById('status'); return e ? e.textContent : null")
            == "done")
            .then_some(())
    });
    assert_eq!(
        b.js("return document.getElementById('moved').textContent"),
        "3"
    );
    b.screenshot(&dir.join("replay-done.png"));
    assert_eq!(ready(&t, &dlq).await, 2, "the two declined stay");
    assert_eq!(ready(&t, &q).await, 3, "three are back in the source queue");
    let mut back = Vec::new();
    while let Some(d) = t.get(&q).await.unwrap() {
        let h = &d.properties.headers;
        assert_eq!(
            h.get("acemq-replayed-from").and_then(|v| v.as_str()),
            Some(dlq.as_str())
        );
        assert_eq!(
            h.get("acemq-replay-count").and_then(|v| v.as_i64()),
            Some(1)
        );
        assert!(h.contains_key("acemq-replayed-at"));
        back.push(
            h.get("x-acemq-id")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned(),
        );
        d.acker
            .settle(Settlement::Ack { multiple: false })
            .await
            .unwrap();
    }
    back.sort();
    let mut want = placed.clone();
    want.sort();
    assert_eq!(back, want, "exactly the timeouts were replayed");

    // A read-only console shows no actions and refuses the POST.
    let ro = console(&url, &["--listen", "127.0.0.1:0"]);
    b.goto(&format!("{}/q/{}", ro.base, enc(&q)));
    assert_eq!(
        b.js("return document.querySelectorAll('#actions').length"),
        0
    );
    assert!(b.text().contains("read-only"));
    let mut r = agent()
        .post(&format!("{}/q/{}/run", ro.base, enc(&q)))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send(b"action=purge&confirm=2&from=dlq&csrf=x".as_slice())
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        403,
        "{}",
        r.body_mut().read_to_string().unwrap_or_default()
    );
    assert_eq!(
        ready(&t, &dlq).await,
        2,
        "the read-only console moved nothing"
    );

    // Not loopback: no start without a token; with one, a page without it is refused.
    let o = support::run(Some(&url), &["console", "--listen", "0.0.0.0:0"]);
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    let token_file = std::env::temp_dir().join(format!("{}.token", support::unique("tok")));
    std::fs::write(&token_file, "t0ken-for-the-test\n").unwrap();
    let guarded = console(
        &url,
        &[
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    let r = agent().get(&format!("{}/", guarded.base)).call().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    b.goto(&format!("{}/q/{}", guarded.base, enc(&q)));
    assert!(b.text().contains("needs its token"), "{}", b.text());
    assert_eq!(
        b.js("return document.querySelectorAll('#groups').length"),
        0
    );
    b.screenshot(&dir.join("token-refused.png"));
    b.goto(&format!("{}/?token=t0ken-for-the-test", guarded.base));
    assert!(
        b.js("return document.querySelectorAll('#queues').length") == 1,
        "{}",
        b.text()
    );
    let _ = std::fs::remove_file(&token_file);

    drop(b);
    support::cleanup(&mq, &q).await;
    let _ = mq.close().await;
}
