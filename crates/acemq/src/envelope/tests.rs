use super::*;

fn props(h: Headers) -> Properties {
    Properties {
        headers: h,
        ..Default::default()
    }
}

#[test]
fn writes_every_field_with_its_wire_type() {
    let e = Envelope::new("order.placed")
        .with_id("id-1")
        .with_causation_id("parent")
        .with_first_seen_millis(1_767_323_045_678);
    let mut h = Headers::new();
    e.write(&mut h, "acemq@host");
    assert_eq!(h[ID], HeaderValue::Str("id-1".into()));
    assert_eq!(h[CORRELATION], HeaderValue::Str("id-1".into()));
    assert_eq!(h[TYPE], HeaderValue::Str("order.placed".into()));
    assert_eq!(h[VERSION], HeaderValue::I32(1));
    assert_eq!(h[ATTEMPT], HeaderValue::I32(1));
    assert_eq!(h[FIRST_SEEN], HeaderValue::I64(1_767_323_045_678));
    assert_eq!(h[ORIGIN], HeaderValue::Str("acemq@host".into()));
    assert_eq!(h[CAUSATION], HeaderValue::Str("parent".into()));
    assert!(!h.contains_key(ERROR) && !h.contains_key(CLAIM));
    assert!(!h.contains_key(REPLAYED_FROM) && !h.contains_key(REPLAY_COUNT));
}

#[test]
fn optional_fields_are_absent_never_empty() {
    let e = Envelope::new("t").with_causation_id("").with_claim("");
    let mut h = Headers::new();
    h.insert(CAUSATION.into(), HeaderValue::from("stale"));
    e.write(&mut h, "o@h");
    assert!(!h.contains_key(CAUSATION));
    assert!(!h.contains_key(CLAIM));
}

#[test]
fn reads_tolerantly_with_family_defaults() {
    let mut h = Headers::new();
    h.insert(ATTEMPT.into(), HeaderValue::from("3"));
    h.insert(VERSION.into(), HeaderValue::I64(0));
    h.insert(FIRST_SEEN.into(), HeaderValue::U32(5));
    h.insert(CORRELATION.into(), HeaderValue::from(""));
    let mut p = props(h);
    p.message_id = Some("mid".into());
    let e = Envelope::read(&p, "");
    assert_eq!(e.id(), "mid");
    assert_eq!(e.correlation_id(), "mid");
    assert_eq!(e.message_type(), "message");
    assert_eq!(e.attempt(), 3);
    assert_eq!(e.version(), 1, "below 1 reads as 1");
    assert_eq!(e.first_seen_millis(), Some(5));
}

#[test]
fn a_message_without_acemq_headers_is_attempt_one_of_its_routing_key() {
    let e = Envelope::read(&Properties::default(), "fx.plain");
    assert_eq!(e.attempt(), 1);
    assert_eq!(e.message_type(), "fx.plain");
    assert!(!e.id().is_empty());
    assert_eq!(e.age(), None);
}

#[test]
fn replayed_at_reads_all_three_forms() {
    let expected = from_millis(1_770_091_506_789).unwrap();
    let java_number = HeaderValue::I64(1_770_091_506_789);
    let go_z = HeaderValue::from("2026-02-03T04:05:06.789Z");
    let python = HeaderValue::from("2026-02-03T04:05:06.789000+00:00");
    for v in [java_number, go_z, python] {
        assert_eq!(read_instant(&v), Some(expected), "{v:?}");
    }
    assert_eq!(format_instant(expected), "2026-02-03T04:05:06.789Z");
}

#[test]
fn replay_provenance_round_trips_and_counts_up() {
    let at = from_millis(1_770_091_506_789).unwrap();
    let e = Envelope::new("t")
        .replayed("q.dlq", at)
        .replayed("q.dlq", at);
    let mut h = Headers::new();
    e.write(&mut h, "o@h");
    assert_eq!(h[REPLAY_COUNT], HeaderValue::I32(2));
    assert_eq!(
        h[REPLAYED_AT],
        HeaderValue::from("2026-02-03T04:05:06.789Z")
    );
    let back = Envelope::read(&props(h), "q");
    assert_eq!(back.replayed_from(), Some("q.dlq"));
    assert_eq!(back.replayed_at(), Some(at));
    assert_eq!(back.replay_count(), 2);
}

#[test]
fn reserved_prefix_is_stripped_and_refused_case_insensitively() {
    let mut h = Headers::new();
    h.insert("x-acemq-future-field".into(), HeaderValue::from("v"));
    h.insert("acemq-replay-count".into(), HeaderValue::I32(1));
    h.insert("traceparent".into(), HeaderValue::from("00-abc"));
    let app = application_headers(&h);
    assert_eq!(
        app.keys().collect::<Vec<_>>(),
        vec!["acemq-replay-count", "traceparent"]
    );
    assert!(matches!(
        check_application_headers(&h),
        Err(Error::ReservedHeader { name }) if name == "x-acemq-future-field"
    ));
    assert!(check_application_headers(&app).is_ok());
}

#[test]
fn origin_is_client_at_host() {
    let o = origin_for("acemq");
    let (client, host) = o.split_once('@').unwrap();
    assert_eq!(client, "acemq");
    assert!(!host.is_empty());
}

#[test]
fn the_envelopes_names_read_off_the_wire_come_back_static_and_others_owned() {
    let envelope_names = [
        ID,
        TYPE,
        VERSION,
        CORRELATION,
        CAUSATION,
        ATTEMPT,
        FIRST_SEEN,
        ORIGIN,
        ERROR,
        CLAIM,
        REPLAYED_FROM,
        REPLAYED_AT,
        REPLAY_COUNT,
        REPLY_TO,
        REPLY_ERROR,
        crate::observe::trace::TRACEPARENT,
        crate::observe::trace::TRACESTATE,
    ];
    for name in envelope_names {
        let read = crate::headers::HeaderName::wire(name);
        assert!(read.is_static(), "{name} is not in headers::WELL_KNOWN");
        assert_eq!(read.as_str(), name);
    }
    let other = crate::headers::HeaderName::wire("x-tenant");
    assert!(!other.is_static());
    assert_eq!(other.as_str(), "x-tenant");
}

#[test]
fn writing_over_a_delivered_envelope_removes_its_stale_fields_and_keeps_the_rest() {
    let mut h = Headers::new();
    Envelope::new("t")
        .with_causation_id("cause")
        .with_claim("claim")
        .with_error(Some("boom".into()))
        .with_route(Some(crate::envelope::Route::start(["a", "b"])))
        .into_headers(&mut h, "o@h");
    h.insert("x-tenant".into(), HeaderValue::from("acme"));
    // A copy republished without those fields (what settlement does) must not keep them.
    Envelope::new("t").into_headers(&mut h, "o@h");
    for gone in [CAUSATION, CLAIM, ERROR, "x-acemq-route"] {
        assert!(!h.contains_key(gone), "{gone} left behind");
    }
    assert_eq!(h["x-tenant"].as_str(), Some("acme"));
    // Fresh headers (no reserved name) get only what is set.
    let mut fresh = Headers::new();
    fresh.insert("x-tenant".into(), HeaderValue::from("acme"));
    Envelope::new("t").into_headers(&mut fresh, "o@h");
    assert!(!fresh.contains_key(CAUSATION) && !fresh.contains_key(ERROR));
    assert_eq!(fresh["x-tenant"].as_str(), Some("acme"));
}

#[test]
fn a_fresh_id_is_a_lowercase_hyphenated_uuid_v4_also_when_read_without_one() {
    let fresh = Envelope::new("t");
    let read = Envelope::read(&Properties::default(), "t");
    for id in [fresh.id(), read.id()] {
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(id, id.to_lowercase());
        let parsed = uuid::Uuid::parse_str(id).unwrap();
        assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{id}");
        assert_eq!(parsed.hyphenated().to_string(), id);
    }
    assert_ne!(fresh.id(), read.id());
    assert_eq!(fresh.correlation_id(), fresh.id());
}

#[test]
fn a_fresh_envelope_is_what_new_then_with_id_and_correlation_gives() {
    let given = |id: Option<&str>, c: Option<&str>| {
        let mut e = Envelope::new("t");
        if let Some(id) = id {
            e = e.with_id(id);
        }
        if let Some(c) = c {
            e = e.with_correlation_id(c);
        }
        e
    };
    for (id, c) in [
        (None, None),
        (Some("m-1"), None),
        (None, Some("c-1")),
        (Some("m-1"), Some("c-1")),
    ] {
        let fresh = Envelope::fresh("t".into(), id.map(Into::into), c.map(Into::into));
        let built = given(id, c);
        match id {
            Some(id) => assert_eq!(fresh.id(), id),
            None => assert_eq!(fresh.id().len(), 36, "a fresh UUID: {}", fresh.id()),
        }
        let expected = c.map_or_else(|| fresh.id().to_owned(), str::to_owned);
        assert_eq!(
            fresh.correlation_id(),
            expected,
            "id {id:?}, correlation {c:?}"
        );
        match c {
            Some(c) => assert_eq!(built.correlation_id(), c),
            None => assert_eq!(built.correlation_id(), built.id()),
        }
        assert_eq!(fresh.message_type(), built.message_type());
        assert_eq!((fresh.attempt(), fresh.version()), (1, 1));
    }
    assert_eq!(
        Envelope::fresh(String::new(), None, None).message_type(),
        "message"
    );
}
