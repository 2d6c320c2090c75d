//! Pipelines and routing slips (`acemq::pipeline`), on `memory://` and RabbitMQ: a first
//! hop written the way the Java member writes it carried through two Rust steps (same id,
//! same run id, position advanced, attempt reset); a step that fails then succeeds does not
//! re-run the step before it; one idempotency store shared by two steps skips neither (and
//! a duplicate run is dropped at each); replay from a step's `.dlq` resumes the run there;
//! a JSON slip in the canonical and in Python's form is followed and written back as
//! canonical JSON; the builder's refusals.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{HandlerError, Message};
use acemq::envelope::Envelope;
use acemq::headers::{HeaderValue, Headers};
use acemq::idempotency::{IdempotencyStore, InMemoryIdempotencyStore};
use acemq::pipeline::{ROUTING_SLIP, RoutingSlip};
use acemq::publish::SendOptions;
use acemq::retry::RetryPolicy;
use acemq::transport::{Confirmation, Outbound, Properties};
use support::{Broker, eventually, on_each_target, unique};

const WAIT: Duration = Duration::from_secs(30);

/// What a step saw: (payload, id, attempt, route position, run id).
type Seen = Arc<Mutex<Vec<(u32, String, i32, Option<i32>, Option<String>)>>>;

fn saw(seen: &Seen, m: &Message<u32>) {
    let e = m.envelope();
    seen.lock().unwrap().push((
        *m.payload(),
        e.id().to_owned(),
        e.attempt(),
        e.route().map(|r| r.position()),
        e.route().map(|r| r.id().to_owned()),
    ));
}

fn count(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

/// Deletes a pipeline's queues (and their companions) and its exchange.
async fn teardown(mq: &Connection, name: &str, steps: &[&str]) {
    for s in steps {
        support::delete_queues(mq, &format!("{name}.{s}"), &[]).await;
    }
    let _ = mq.transport().delete_exchange(name).await;
}

/// A first hop exactly as the Java member's `Pipeline.send` writes it.
fn java_first_hop(pipeline: &str, id: &str, run: &str, n: u32) -> Outbound {
    let mut h = Headers::new();
    h.insert("x-acemq-id".into(), HeaderValue::from(id));
    h.insert("x-acemq-type".into(), HeaderValue::from(pipeline));
    h.insert("x-acemq-version".into(), HeaderValue::I32(1));
    h.insert("x-acemq-correlation".into(), HeaderValue::from("corr-java"));
    h.insert("x-acemq-attempt".into(), HeaderValue::I32(1));
    h.insert(
        "x-acemq-first-seen".into(),
        HeaderValue::I64(acemq::envelope::now_millis()),
    );
    h.insert(
        "x-acemq-origin".into(),
        HeaderValue::from("orders@java-host"),
    );
    h.insert(
        "x-acemq-route".into(),
        HeaderValue::from("validate,reserve"),
    );
    h.insert("x-acemq-route-position".into(), HeaderValue::I32(0));
    h.insert("x-acemq-route-id".into(), HeaderValue::from(run));
    h.insert("x-tenant".into(), HeaderValue::from("acme"));
    let properties = Properties {
        message_id: Some(id.into()),
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        headers: h,
        ..Properties::default()
    };
    Outbound::new(pipeline, "validate", properties, n.to_string())
}

#[tokio::test]
async fn a_java_shaped_run_is_carried_through_two_rust_steps() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = unique("pipe-java");
        let (validated, reserved): (Seen, Seen) = (Arc::default(), Arc::default());
        let (v, r) = (validated.clone(), reserved.clone());
        let tenants: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let t = tenants.clone();
        let p = mq
            .pipeline::<u32>(&name)
            .step("validate", move |m: Message<u32>| {
                let v = v.clone();
                async move {
                    saw(&v, &m);
                    Ok(Some(*m.payload() + 1))
                }
            })
            .step("reserve", move |m: Message<u32>| {
                let (r, t) = (r.clone(), t.clone());
                async move {
                    saw(&r, &m);
                    t.lock().unwrap().push(
                        m.headers()
                            .get("x-tenant")
                            .and_then(|v| v.as_str())
                            .map(str::to_owned),
                    );
                    Ok(None::<()>)
                }
            })
            .build()
            .await
            .unwrap();
        let c = support::publish_confirmed(
            &**mq.transport(),
            java_first_hop(&name, "java-msg-1", "run-java-1", 41),
        )
        .await;
        assert_eq!(c, Confirmation::Routed);
        eventually(WAIT, "the run completed", || async {
            (p.stats().completed == 1).then_some(())
        })
        .await;
        let v = validated.lock().unwrap().clone();
        let r = reserved.lock().unwrap().clone();
        assert_eq!(
            v,
            vec![(
                41,
                "java-msg-1".into(),
                1,
                Some(0),
                Some("run-java-1".into())
            )]
        );
        assert_eq!(
            r,
            vec![(
                42,
                "java-msg-1".into(),
                1,
                Some(1),
                Some("run-java-1".into())
            )],
            "same id and run id, the position advanced"
        );
        assert_eq!(*tenants.lock().unwrap(), vec![Some("acme".to_owned())]);
        p.close().await;
        teardown(&mq, &name, &["validate", "reserve"]).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn a_failing_step_retries_alone_with_its_whole_budget() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = unique("pipe-retry");
        let (validated, reserved): (Seen, Seen) = (Arc::default(), Arc::default());
        let (v, r) = (validated.clone(), reserved.clone());
        let policy = RetryPolicy::fixed(3, Duration::from_millis(20)).unwrap();
        let p = mq
            .pipeline::<u32>(&name)
            .step("validate", move |m: Message<u32>| {
                let v = v.clone();
                async move {
                    saw(&v, &m);
                    if m.attempt() < 2 {
                        return Err(HandlerError::retry("validate: once"));
                    }
                    Ok(Some(*m.payload()))
                }
            })
            .retry(policy.clone())
            .step("reserve", move |m: Message<u32>| {
                let r = r.clone();
                async move {
                    saw(&r, &m);
                    if m.attempt() < 3 {
                        return Err(HandlerError::retry("reserve: not yet"));
                    }
                    Ok(None::<()>)
                }
            })
            .retry(policy)
            .build()
            .await
            .unwrap();
        let run = p.send(&7).await.unwrap();
        eventually(WAIT, "the run completed", || async {
            (p.stats().completed == 1).then_some(())
        })
        .await;
        let attempts = |s: &Seen| s.lock().unwrap().iter().map(|x| x.2).collect::<Vec<_>>();
        assert_eq!(
            attempts(&validated),
            vec![1, 2],
            "validate ran twice, then never again"
        );
        // Java would hand reserve attempt 2 and a budget of one more try.
        assert_eq!(
            attempts(&reserved),
            vec![1, 2, 3],
            "reserve's own budget, from 1"
        );
        assert!(
            reserved
                .lock()
                .unwrap()
                .iter()
                .all(|x| x.4.as_deref() == Some(run.as_str()))
        );
        p.close().await;
        teardown(&mq, &name, &["validate", "reserve"]).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn one_shared_idempotency_store_skips_no_step() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = unique("pipe-idem");
        let store = Arc::new(InMemoryIdempotencyStore::for_one_day());
        let (validated, reserved): (Seen, Seen) = (Arc::default(), Arc::default());
        let (v, r) = (validated.clone(), reserved.clone());
        let p = mq
            .pipeline::<u32>(&name)
            .step("validate", move |m: Message<u32>| {
                let v = v.clone();
                async move {
                    saw(&v, &m);
                    Ok(Some(*m.payload()))
                }
            })
            .idempotent(store.clone())
            .step("reserve", move |m: Message<u32>| {
                let r = r.clone();
                async move {
                    saw(&r, &m);
                    Ok(None::<()>)
                }
            })
            .idempotent(store.clone())
            .build()
            .await
            .unwrap();
        p.send_with(&1, SendOptions::new().message_id("order-1"))
            .await
            .unwrap();
        eventually(WAIT, "both steps ran", || async {
            (count(&reserved) == 1).then_some(())
        })
        .await;
        // The same message again: each step recognises it.
        p.send_with(&1, SendOptions::new().message_id("order-1"))
            .await
            .unwrap();
        eventually(WAIT, "the duplicate dropped at the first step", || async {
            (p.step("validate")?.stats().await.duplicates == 1).then_some(())
        })
        .await;
        assert_eq!((count(&validated), count(&reserved)), (1, 1));
        assert!(
            store
                .is_confirmed(&format!("{name}.validate:order-1"))
                .await
                .unwrap()
        );
        assert!(
            store
                .is_confirmed(&format!("{name}.reserve:order-1"))
                .await
                .unwrap()
        );
        p.close().await;
        teardown(&mq, &name, &["validate", "reserve"]).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn replay_from_a_steps_dlq_resumes_the_run_there() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = unique("pipe-replay");
        let broken = Arc::new(Mutex::new(true));
        let (validated, reserved): (Seen, Seen) = (Arc::default(), Arc::default());
        let (v, r, b) = (validated.clone(), reserved.clone(), broken.clone());
        let p = mq
            .pipeline::<u32>(&name)
            .step("validate", move |m: Message<u32>| {
                let v = v.clone();
                async move {
                    saw(&v, &m);
                    Ok(Some(*m.payload() * 10))
                }
            })
            .step("reserve", move |m: Message<u32>| {
                let (r, b) = (r.clone(), b.clone());
                async move {
                    saw(&r, &m);
                    if *b.lock().unwrap() {
                        return Err(HandlerError::fatal("the stock service is down"));
                    }
                    Ok(None::<()>)
                }
            })
            .build()
            .await
            .unwrap();
        let run = p.send(&3).await.unwrap();
        let reserve_q = p.queue_for("reserve");
        eventually(WAIT, "the run dead-lettered at reserve", || async {
            (mq.replay(&reserve_q).pending().await.ok()? == 1).then_some(())
        })
        .await;
        *broken.lock().unwrap() = false;
        let report = mq.replay(&reserve_q).replay_all().await.unwrap();
        assert_eq!(report.replayed, 1);
        eventually(WAIT, "the run completed after the replay", || async {
            (p.stats().completed == 1).then_some(())
        })
        .await;
        assert_eq!(count(&validated), 1, "validate did not run again");
        let r = reserved.lock().unwrap().clone();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].0, 30);
        assert_eq!(r[1].3, Some(1));
        assert_eq!(
            r[1].4.as_deref(),
            Some(run.as_str()),
            "the run id survived the dlq"
        );
        p.close().await;
        teardown(&mq, &name, &["validate", "reserve"]).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn a_json_slip_in_either_form_is_followed_and_written_back_canonically() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = unique("pipe-slip");
        let dest = unique("slip-dest");
        support::declare_classic(&mq, &dest).await;
        let p = mq
            .pipeline::<u32>(&name)
            .step("enrich", |m: Message<u32>| async move { Ok(Some(*m.payload() + 1)) })
            .build()
            .await
            .unwrap();
        let queue = p.queue_for("enrich");
        let canonical = format!(
            r#"{{"steps":[{{"exchange":"","routingKey":"{queue}","name":"enrich"}},{{"exchange":"","routingKey":"{dest}","name":"ship"}}]}}"#
        );
        let python = format!(
            r#"{{"steps": [{{"exchange": "", "routingKey": "{queue}", "name": "enrich"}}, {{"exchange": "", "routingKey": "{dest}", "name": "ship"}}], "done": [{{"exchange": "", "routingKey": "start", "name": "start", "completedAt": "2026-03-04T05:06:07.123456+00:00"}}]}}"#
        );
        for (form, slip) in [("canonical", &canonical), ("python", &python)] {
            let mut h = Headers::new();
            h.insert(ROUTING_SLIP.into(), HeaderValue::from(slip.as_str()));
            let props = Properties {
                content_type: Some("application/json".into()),
                headers: h,
                ..Properties::default()
            };
            let c = support::publish_raw(&**mq.transport(), &queue, props, b"1").await;
            assert_eq!(c, Confirmation::Routed, "{form}");
            let d = support::take_one(&**mq.transport(), &dest, WAIT).await;
            assert_eq!(d.body.as_ref(), b"2", "{form}");
            let written = d.properties.headers[ROUTING_SLIP].as_str().unwrap().to_owned();
            let back = RoutingSlip::parse(&written).unwrap();
            assert_eq!(back.current().unwrap().routing_key(), dest, "{form}");
            let enrich = back.done().last().unwrap();
            let stamp = enrich.completed_at().unwrap().to_owned();
            assert!(
                stamp.len() == 20 && stamp.ends_with('Z'),
                "{form}: completedAt to the second: {stamp}"
            );
            let mut expected = String::from(r#"{"steps":[{"exchange":"","routingKey":""#);
            expected.push_str(&dest);
            expected.push_str(r#"","name":"ship"}],"done":["#);
            if form == "python" {
                expected.push_str(r#"{"exchange":"","routingKey":"start","name":"start","completedAt":"2026-03-04T05:06:07.123456+00:00"},"#);
            }
            expected.push_str(&format!(
                r#"{{"exchange":"","routingKey":"{queue}","name":"enrich","completedAt":"{stamp}"}}]}}"#
            ));
            assert_eq!(written, expected, "{form}: canonical bytes");
            // JSON arrived, JSON goes on: no declared route added.
            assert!(Envelope::read(&d.properties, "").route().is_none(), "{form}");
        }
        p.close().await;
        teardown(&mq, &name, &["enrich"]).await;
        let _ = mq.transport().delete_queue(&dest).await;
        mq.close().await.ok();
    })
    .await;
}

#[tokio::test]
async fn the_builder_refuses_what_no_member_could_route() {
    let mq = Connection::connect(&format!("memory://{}", unique("pipe-refuse")))
        .await
        .unwrap();
    let ok = |m: Message<u32>| async move { Ok(Some(*m.payload())) };
    for (bad, why) in [
        ("one,two", "not one every member"),
        ("", "not one every member"),
        ("a_b", "not one every member"),
    ] {
        let e = mq
            .pipeline::<u32>("p")
            .step(bad, ok)
            .build()
            .await
            .unwrap_err();
        assert!(e.to_string().contains(why), "{bad:?}: {e}");
    }
    let e = mq
        .pipeline::<u32>("p")
        .step("a", ok)
        .step("a", ok)
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
    let e = mq.pipeline::<u32>("p").build().await.unwrap_err();
    assert!(e.to_string().contains("has no step"), "{e}");
    let e = mq
        .pipeline::<u32>("p")
        .concurrency(2)
        .step("a", ok)
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("before any step"), "{e}");
}

#[test]
fn the_canonical_slip_bytes_match_the_fixtures() {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../contract/routing-slips.json")).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut slip = match (case.get("build"), case.get("read")) {
            (Some(stops), _) => {
                stops
                    .as_array()
                    .unwrap()
                    .iter()
                    .fold(RoutingSlip::new(), |s, stop| {
                        s.then(
                            stop[0].as_str().unwrap(),
                            stop[1].as_str().unwrap(),
                            stop[2].as_str().unwrap(),
                        )
                    })
            }
            (None, Some(text)) => RoutingSlip::parse(text.as_str().unwrap()).unwrap(),
            _ => panic!("{name}: neither build nor read"),
        };
        if let Some(at) = case.get("advance_at") {
            let at = time::OffsetDateTime::parse(
                at.as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap();
            slip = slip.advanced(at);
        }
        let canonical = case["canonical"].as_str().unwrap();
        assert_eq!(slip.to_header(), canonical, "{name}");
        assert_eq!(
            RoutingSlip::parse(canonical).unwrap().to_header(),
            canonical,
            "{name}: a round trip keeps the bytes"
        );
    }
}

#[tokio::test]
async fn a_slip_started_here_is_followed_by_any_consumer() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let (first, dest) = (unique("slip-first"), unique("slip-last"));
        support::declare_classic(&mq, &first).await;
        support::declare_classic(&mq, &dest).await;
        let follower = mq
            .follow_slip(
                &first,
                None,
                acemq::consume::ConsumerOptions::default(),
                |m: Message<u32>| async move { Ok(Some(*m.payload() * 3)) },
            )
            .await
            .unwrap();
        let slip = RoutingSlip::new().then("", &first, "triple").then("", &dest, "");
        let id = mq.start_slip(&slip, &5u32).await.unwrap();
        let d = support::take_one(&**mq.transport(), &dest, WAIT).await;
        assert_eq!(d.body.as_ref(), b"15");
        assert_eq!(d.properties.message_id.as_deref(), Some(id.as_str()));
        let written = d.properties.headers[ROUTING_SLIP].as_str().unwrap();
        let back = RoutingSlip::parse(written).unwrap();
        let stamp = back.done()[0].completed_at().unwrap();
        assert_eq!(
            written,
            format!(
                r#"{{"steps":[{{"exchange":"","routingKey":"{dest}"}}],"done":[{{"exchange":"","routingKey":"{first}","name":"triple","completedAt":"{stamp}"}}]}}"#
            )
        );
        // A declared route reaching a follower told no pipeline is refused, not misrouted.
        let mut h = Headers::new();
        h.insert("x-acemq-route".into(), HeaderValue::from("a,b"));
        let props = Properties {
            content_type: Some("application/json".into()),
            headers: h,
            ..Properties::default()
        };
        support::publish_raw(&**mq.transport(), &first, props, b"1").await;
        let dead = support::take_one(&**mq.transport(), &format!("{first}.dlq"), WAIT).await;
        let reason = Envelope::read(&dead.properties, "").error().unwrap_or_default().to_owned();
        assert!(reason.contains("not told its pipeline"), "{reason}");
        follower.close().await;
        let _ = mq.transport().delete_queue(&dest).await;
        support::teardown(&mq, &first, &[]).await;
    })
    .await;
}
