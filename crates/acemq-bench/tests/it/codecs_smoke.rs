//! Proves the codec scenarios still run: every codec round-trips the order with tiny counts.

#[tokio::test]
async fn every_codec_scenario_runs() {
    let rows = acemq_bench::codecs::run(50).await.expect("codec run");
    let names: Vec<&str> = rows.iter().map(|r| r.codec).collect();
    assert_eq!(
        names,
        [
            "json",
            "yaml",
            "toml",
            "xml",
            "avro (fixed)",
            "avro (registered)",
            "protobuf"
        ]
    );
    assert!(rows.iter().all(|r| r.round_trip_rate > 0.0 && r.bytes > 0));
    let table = acemq_bench::codecs::table(&rows);
    assert!(table.contains("application/vnd.acemq.avro"), "{table}");
}
