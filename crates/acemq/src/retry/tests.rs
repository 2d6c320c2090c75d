use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

fn ms(list: &[Duration]) -> Vec<u128> {
    list.iter().map(Duration::as_millis).collect()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn invalid_arguments_are_errors_not_panics() {
    assert_eq!(
        RetryPolicy::fixed(0, secs(1)),
        Err(RetryError::ZeroAttempts)
    );
    assert_eq!(
        RetryPolicy::exponential(0, secs(1), secs(2)),
        Err(RetryError::ZeroAttempts)
    );
    assert!(matches!(
        RetryPolicy::exponential(3, Duration::ZERO, secs(2)),
        Err(RetryError::InitialDelayTooShort { .. })
    ));
    assert!(matches!(
        RetryPolicy::exponential(3, Duration::from_micros(999), secs(2)),
        Err(RetryError::InitialDelayTooShort { .. })
    ));
    assert!(matches!(
        RetryPolicy::exponential(3, secs(10), secs(2)),
        Err(RetryError::MaxBelowInitial { .. })
    ));
    for bad in [0.99, 0.0, -2.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(
            matches!(
                RetryPolicy::exponential_with_multiplier(3, secs(1), bad, secs(10)),
                Err(RetryError::InvalidMultiplier { .. })
            ),
            "multiplier {bad}"
        );
    }
    let p = RetryPolicy::none();
    for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(p.with_jitter(bad), Err(RetryError::InvalidJitter { .. })),
            "jitter {bad}"
        );
    }
    assert!(p.with_jitter(0.0).is_ok());
    assert!(p.with_jitter(1.0).is_ok());
}

#[test]
fn error_messages_say_what_to_do() {
    let text = RetryError::ZeroAttempts.to_string();
    assert!(text.contains("RetryPolicy::none()"), "{text}");
    let text = RetryError::InvalidJitter { factor: 2.0 }.to_string();
    assert!(text.contains("between 0.0 and 1.0"), "{text}");
}

#[test]
fn exponential_doubles_and_caps_at_every_step() {
    let p = RetryPolicy::exponential(5, secs(1), secs(86_400)).unwrap();
    assert_eq!(ms(&p.schedule()), [1000, 2000, 4000, 8000]);
    let p = RetryPolicy::exponential(6, secs(10), secs(60)).unwrap();
    assert_eq!(ms(&p.schedule()), [10_000, 20_000, 40_000, 60_000, 60_000]);
    assert_eq!(ms(&p.broker_rungs()), [40_000, 60_000]);
}

#[test]
fn exponential_with_multiplier_truncates_to_whole_millis() {
    let p = RetryPolicy::exponential_with_multiplier(6, Duration::from_millis(100), 1.5, secs(1))
        .unwrap();
    // 100, 150, 225, 337.5, 506.25 -> truncated
    assert_eq!(ms(&p.schedule()), [100, 150, 225, 337, 506]);
    assert_eq!(p.jitter_factor(), 0.2);
    let p = RetryPolicy::exponential_with_multiplier(5, secs(1), 3.0, secs(20)).unwrap();
    assert_eq!(ms(&p.schedule()), [1000, 3000, 9000, 20_000]);
    // Multiplier 1 is a fixed delay (with the exponential's jitter).
    let p = RetryPolicy::exponential_with_multiplier(4, secs(2), 1.0, secs(20)).unwrap();
    assert_eq!(ms(&p.schedule()), [2000, 2000, 2000]);
}

#[test]
fn next_wait_uses_the_last_delay_past_the_end_and_stops_at_max_attempts() {
    let p = RetryPolicy::exponential(4, secs(1), secs(100))
        .unwrap()
        .with_jitter(0.0)
        .unwrap();
    assert_eq!(p.next_delay(1, None), Some(secs(1)));
    assert_eq!(p.next_delay(3, None), Some(secs(4)));
    assert_eq!(p.next_delay(4, None), None);
    assert_eq!(p.next_delay(0, None), Some(secs(1)));
    // delay_at clamps to the last entry.
    assert_eq!(p.delay_at(99), Some(secs(4)));
}

#[test]
fn huge_max_attempts_is_cheap_for_rungs_and_late_attempts() {
    let p = RetryPolicy::exponential(u32::MAX, secs(1), secs(3600)).unwrap();
    assert_eq!(
        ms(&p.broker_rungs()),
        [
            32_000, 64_000, 128_000, 256_000, 512_000, 1_024_000, 2_048_000, 3_600_000
        ]
    );
    let w = p.next_wait(u32::MAX - 1, None).unwrap();
    assert_eq!(
        w,
        Wait {
            delay: secs(3600),
            in_broker: true
        }
    );
    assert!(p.to_string().contains("more"), "{p}");
}

#[test]
fn rungs_are_deduplicated_and_in_schedule_order() {
    let p = RetryPolicy::fixed(5, secs(60)).unwrap();
    assert_eq!(p.broker_rungs(), [secs(60)]);
    let p = RetryPolicy::exponential(8, secs(15), secs(120)).unwrap();
    assert_eq!(
        ms(&p.schedule()),
        [15_000, 30_000, 60_000, 120_000, 120_000, 120_000, 120_000]
    );
    assert_eq!(ms(&p.broker_rungs()), [30_000, 60_000, 120_000]);
}

#[test]
fn threshold_zero_means_no_rungs_and_every_wait_in_the_consumer() {
    let p = RetryPolicy::exponential(6, secs(10), secs(300))
        .unwrap()
        .wait_in_broker_from(Duration::ZERO);
    assert!(p.broker_rungs().is_empty());
    let mut rng = StdRng::seed_from_u64(1);
    for attempt in 1..6 {
        let w = p.next_wait_with(&mut rng, attempt, None).unwrap();
        assert!(!w.in_broker);
    }
    assert!(!p.waits_in_broker(secs(3600)));
}

#[test]
fn threshold_moves_the_line() {
    let p = RetryPolicy::exponential(6, secs(10), secs(300))
        .unwrap()
        .wait_in_broker_from(secs(60));
    assert_eq!(ms(&p.broker_rungs()), [80_000, 160_000]);
    let p = p.wait_in_broker_from(Duration::from_millis(500));
    assert_eq!(
        ms(&p.broker_rungs()),
        [10_000, 20_000, 40_000, 80_000, 160_000]
    );
}

#[test]
fn consumer_waits_are_floored_at_one_millisecond() {
    let p = RetryPolicy::fixed(3, Duration::ZERO).unwrap();
    assert_eq!(p.next_delay(1, None), Some(Duration::from_millis(1)));
    let p = p.with_jitter(1.0).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..1000 {
        let d = p.next_wait_with(&mut rng, 1, None).unwrap().delay;
        assert!(d >= Duration::from_millis(1));
    }
    let p = RetryPolicy::fixed(3, Duration::from_millis(1))
        .unwrap()
        .with_jitter(1.0)
        .unwrap();
    for _ in 0..1000 {
        let d = p.next_wait_with(&mut rng, 1, None).unwrap().delay;
        assert!(d >= Duration::from_millis(1) && d <= Duration::from_millis(2));
    }
}

#[test]
fn age_limit_is_reached_not_passed_and_unknown_age_is_young() {
    let p = RetryPolicy::fixed(5, secs(1))
        .unwrap()
        .give_up_after(secs(120));
    assert_eq!(p.max_message_age(), secs(120));
    assert!(p.next_delay(1, None).is_some());
    assert!(
        p.next_delay(1, Some(Duration::from_millis(119_999)))
            .is_some()
    );
    assert!(p.next_delay(1, Some(secs(120))).is_none());
    let p = p.give_up_after(Duration::ZERO);
    assert!(p.next_delay(1, Some(secs(1_000_000))).is_some());
}

#[test]
fn modifiers_return_copies() {
    let base = RetryPolicy::exponential(5, secs(1), secs(60)).unwrap();
    let changed = base.give_up_after(secs(10)).wait_in_broker_from(secs(5));
    assert_eq!(base.max_message_age(), Duration::ZERO);
    assert_eq!(base.broker_wait_threshold(), DEFAULT_BROKER_WAIT_THRESHOLD);
    assert_eq!(changed.broker_wait_threshold(), secs(5));
    assert_ne!(base, changed);
    assert_eq!(base, base.clone());
}

#[test]
fn single_attempt_policies_compare_equal() {
    assert_eq!(RetryPolicy::fixed(1, secs(5)).unwrap(), RetryPolicy::none());
    assert_eq!(
        RetryPolicy::exponential(1, secs(5), secs(10))
            .unwrap()
            .with_jitter(0.0)
            .unwrap(),
        RetryPolicy::none()
    );
}

#[test]
fn display_reads_like_the_java_to_string() {
    let p = RetryPolicy::exponential(5, secs(1), secs(60)).unwrap();
    assert_eq!(
        p.to_string(),
        "RetryPolicy(maxAttempts=5, schedule=[1s, 2s, 4s, 8s], jitter=0.2, brokerWaitThreshold=30s, maxMessageAge=none)"
    );
    let p = RetryPolicy::fixed(2, Duration::from_millis(1500))
        .unwrap()
        .give_up_after(secs(7200))
        .wait_in_broker_from(Duration::ZERO);
    assert_eq!(
        p.to_string(),
        "RetryPolicy(maxAttempts=2, schedule=[1500ms], jitter=0, brokerWaitThreshold=never, maxMessageAge=2h)"
    );
    assert_eq!(
        RetryPolicy::none().to_string(),
        "RetryPolicy(maxAttempts=1, schedule=[], jitter=0, brokerWaitThreshold=30s, maxMessageAge=none)"
    );
}
