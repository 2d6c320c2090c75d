//! The scheduler's wire: the routing table, Java's argument table, the headers, identity
//! across hops.

use super::*;

fn secs(s: i64) -> i64 {
    s * 1_000
}

#[test]
fn the_routing_table_is_the_familys() {
    // Ruby pins this table.
    let table = [
        (86_400, "1h"),
        (3_600, "1h"),
        (3_599, "10m"),
        (600, "10m"),
        (599, "1m"),
        (60, "1m"),
        (59, "10s"),
        (10, "10s"),
        (9, "1s"),
        (1, "1s"),
    ];
    for (remaining, rung) in table {
        assert_eq!(
            route(secs(remaining)),
            Route::Rung(format!("acemq.schedule.{rung}")),
            "{remaining} s"
        );
    }
    assert_eq!(route(999), Route::Soon(Duration::from_millis(999)));
    assert_eq!(route(1), Route::Soon(Duration::from_millis(1)));
    assert_eq!(route(0), Route::Deliver);
    assert_eq!(route(-5_000), Route::Deliver);
}

#[test]
fn rung_names_follow_describe() {
    assert_eq!(rung_name(Duration::from_secs(90)), "acemq.schedule.90s");
    assert_eq!(rung_name(Duration::from_secs(600)), "acemq.schedule.10m");
    assert_eq!(rung_name(Duration::from_secs(7200)), "acemq.schedule.2h");
    assert_eq!(rung_name(Duration::from_millis(1500)), "acemq.schedule.1s");
}

#[test]
fn the_ladder_is_javas_argument_table() {
    let t = topology();
    let expected = [
        ("acemq.schedule.1h", 3_600_000i64),
        ("acemq.schedule.10m", 600_000),
        ("acemq.schedule.1m", 60_000),
        ("acemq.schedule.10s", 10_000),
        ("acemq.schedule.1s", 1_000),
    ];
    for (name, ttl) in expected {
        let q = t.queue(name).expect(name);
        assert!(q.durable && !q.exclusive && !q.auto_delete);
        let mut args: Vec<(&str, &HeaderValue)> =
            q.arguments.iter().map(|(k, v)| (k.as_str(), v)).collect();
        args.sort_by_key(|(k, _)| *k);
        assert_eq!(
            args,
            vec![
                (
                    "x-dead-letter-exchange",
                    &HeaderValue::Str("acemq.schedule".into())
                ),
                (
                    "x-dead-letter-routing-key",
                    &HeaderValue::Str("acemq.schedule.due".into())
                ),
                ("x-message-ttl", &HeaderValue::I64(ttl)),
            ]
        );
        assert!(
            t.bindings()
                .iter()
                .any(|b| b.queue == name && b.exchange == EXCHANGE && b.routing_key == name)
        );
    }
    let control = t.queue(CONTROL_QUEUE).expect("control queue");
    assert!(control.durable && control.arguments.is_empty());
    assert_eq!(t.exchanges().len(), 1);
    assert_eq!(t.exchanges()[0].kind, ExchangeKind::Direct);
    assert!(t.exchanges()[0].durable);
}

fn family_headers(due: HeaderValue) -> Headers {
    let mut h = Headers::new();
    h.insert(TARGET_EXCHANGE.into(), HeaderValue::from("billing"));
    h.insert(TARGET_ROUTING_KEY.into(), HeaderValue::from("invoice.due"));
    h.insert(DUE_AT.into(), due);
    h
}

#[test]
fn the_due_time_is_read_at_any_width() {
    for v in [
        HeaderValue::I64(1_700_000_000_000),
        HeaderValue::U32(1_700_000),
        HeaderValue::I32(5),
        HeaderValue::I16(5),
        HeaderValue::U8(5),
        HeaderValue::from("1700000000000"),
        HeaderValue::F64(1.7e12),
    ] {
        let t = Target::read(&family_headers(v.clone())).expect("readable");
        assert_eq!(t.due_at_ms, millis(&v).unwrap());
        assert_eq!(t.content_type, DEFAULT_CONTENT_TYPE);
    }
    let e = Target::read(&family_headers(HeaderValue::Bool(true))).unwrap_err();
    assert!(e.contains("x-schedule-due-at is not a number"), "{e}");
    let e = Target::read(&Headers::new()).unwrap_err();
    assert!(e.contains("x-schedule-exchange is missing"), "{e}");
    assert!(e.contains("x-schedule-due-at is missing"), "{e}");
}

fn original() -> Outbound {
    let mut headers = Headers::new();
    Envelope::new("invoice.due")
        .with_id("m-1")
        .with_correlation_id("c-1")
        .with_causation_id("k-1")
        .write(&mut headers, "svc@host");
    headers.insert(
        "traceparent".into(),
        HeaderValue::from("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    );
    headers.insert("x-tenant".into(), HeaderValue::from("acme"));
    let properties = Properties {
        message_id: Some("m-1".into()),
        content_type: Some("application/x-protobuf".into()),
        headers,
        ..Properties::default()
    };
    Outbound::new(
        "billing",
        "invoice.due",
        properties,
        Bytes::from_static(b"\x08\x01"),
    )
}

#[test]
fn identity_travels_through_hops_and_is_delivered() {
    let first = scheduled(original(), 42, "acemq.schedule.10s", "svc@host");
    let h = &first.properties.headers;
    assert_eq!(first.exchange, EXCHANGE);
    assert_eq!(h[DUE_AT], HeaderValue::I64(42));
    assert_eq!(h[CONTENT_TYPE].as_str(), Some("application/x-protobuf"));
    assert_eq!(h["x-schedule-acemq-id"].as_str(), Some("m-1"));
    assert_eq!(h[envelope::TYPE].as_str(), Some(HOP_TYPE));
    assert_ne!(h[envelope::ID].as_str(), Some("m-1"));
    assert_eq!(
        first.properties.content_type.as_deref(),
        Some(HOP_CONTENT_TYPE)
    );
    // As the control queue hands it over: application headers only, plus death records.
    let mut delivered = crate::envelope::application_headers(h);
    delivered.insert("x-death".into(), HeaderValue::Array(vec![]));
    delivered.insert("x-first-death-queue".into(), HeaderValue::from("r"));
    let next = hop(
        &delivered,
        first.body.clone(),
        "acemq.schedule.1s",
        "svc@host",
    );
    assert_eq!(next.routing_key, "acemq.schedule.1s");
    assert!(!next.properties.headers.contains_key("x-death"));
    assert!(!next.properties.headers.contains_key("x-first-death-queue"));
    assert_eq!(next.body, first.body);
    let app = crate::envelope::application_headers(&next.properties.headers);
    let target = Target::read(&app).expect("target");
    let (out, id) = delivery(&app, next.body.clone(), &target, "scheduler@host");
    assert_eq!(id, "m-1");
    assert_eq!(
        (out.exchange.as_str(), out.routing_key.as_str()),
        ("billing", "invoice.due")
    );
    assert_eq!(out.properties.message_id.as_deref(), Some("m-1"));
    assert_eq!(
        out.properties.content_type.as_deref(),
        Some("application/x-protobuf")
    );
    let e = Envelope::read(&out.properties, &out.routing_key);
    assert_eq!(e.message_type(), "invoice.due");
    assert_eq!(e.correlation_id(), "c-1");
    assert_eq!(e.causation_id(), Some("k-1"));
    assert_eq!(e.origin(), Some("svc@host"));
    let h = &out.properties.headers;
    assert!(
        h["traceparent"]
            .as_str()
            .unwrap()
            .contains("0af7651916cd43dd8448eb211c80319c")
    );
    assert_eq!(h["x-tenant"].as_str(), Some("acme"));
    assert!(h.keys().all(|k| !k.starts_with("x-schedule-")), "{h:?}");
    assert_eq!(out.body, Bytes::from_static(b"\x08\x01"));
}

#[test]
fn a_message_another_member_scheduled_gets_the_familys_envelope() {
    let mut h = family_headers(HeaderValue::I64(1));
    h.insert("x-tenant".into(), HeaderValue::from("acme"));
    let target = Target::read(&h).unwrap();
    let (out, id) = delivery(&h, Bytes::from_static(b"{}"), &target, "s@h");
    let e = Envelope::read(&out.properties, "");
    assert_eq!(e.message_type(), HOP_TYPE);
    assert_eq!(e.id(), id);
    assert_eq!(e.correlation_id(), id);
    assert_eq!(
        out.properties.content_type.as_deref(),
        Some(DEFAULT_CONTENT_TYPE)
    );
    assert_eq!(out.properties.headers["x-tenant"].as_str(), Some("acme"));
    assert!(!out.properties.headers.contains_key(DUE_AT));
}
