//! The partition arithmetic and names, exactly as the Java member computes them (`java.md`
//! §2.15): FNV-1a 32-bit over the key's UTF-8 bytes, read as a **signed** 32-bit integer,
//! then `floor_mod(hash, n)`. Queue `{name}.p{i}`, routing key `p{i}`.

/// FNV-1a's 32-bit offset basis.
pub const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
/// FNV-1a's 32-bit prime.
pub const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a 32-bit over `key`'s UTF-8 bytes (xor the byte, then multiply, wrapping).
///
/// ```
/// use acemq::ordered::fnv1a32;
/// assert_eq!(fnv1a32(""), 0x811c9dc5);
/// assert_eq!(fnv1a32("a"), 0xe40c292c);
/// assert_eq!(fnv1a32("foobar"), 0xbf9cf968);
/// ```
pub fn fnv1a32(key: &str) -> u32 {
    key.bytes().fold(FNV_OFFSET_BASIS, |hash, b| {
        (hash ^ u32::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition of `key` among `partitions`: Java's `Math.floorMod((int) hash, n)`, the
/// hash taken as a signed 32-bit integer. Go's `Sum32() % n` (unsigned) agrees only when
/// `n` is a power of two. `partitions` must be at least 1 (0 is answered 0).
///
/// ```
/// use acemq::ordered::partition_for;
/// // "a" hashes to 0xe40c292c, negative as an i32: Java (and this) say 0, unsigned says 1.
/// assert_eq!(partition_for("a", 3), 0);
/// assert_eq!(0xe40c292c_u32 % 3, 1);
/// assert_eq!(partition_for("a", 8), 0xe40c292c_u32 % 8);
/// ```
pub fn partition_for(key: &str, partitions: u32) -> u32 {
    if partitions == 0 {
        return 0;
    }
    // Reinterpreting the bits as i32 is the point (Java's `(int) hash`).
    let hash = i64::from(fnv1a32(key) as i32);
    // rem_euclid with a positive divisor is floor_mod; the result is in 0..partitions.
    u32::try_from(hash.rem_euclid(i64::from(partitions))).unwrap_or(0)
}

/// The queue of partition `i`: `{name}.p{i}`.
///
/// ```
/// assert_eq!(acemq::ordered::partition_queue("orders", 3), "orders.p3");
/// ```
pub fn partition_queue(name: &str, i: u32) -> String {
    format!("{name}.p{i}")
}

/// The routing key of partition `i` on the `{name}` exchange: `p{i}`.
///
/// ```
/// assert_eq!(acemq::ordered::partition_routing_key(3), "p3");
/// ```
pub fn partition_routing_key(i: u32) -> String {
    format!("p{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_hashes_from_java() {
        assert_eq!(fnv1a32(""), 0x811c_9dc5);
        assert_eq!(fnv1a32("a"), 0xe40c_292c);
        assert_eq!(fnv1a32("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn signed_floor_mod_where_unsigned_disagrees() {
        // 0xe40c292c as i32 = -468_965_076; floorMod(-468965076, 3) = 0; unsigned % 3 = 1.
        assert_eq!(fnv1a32("a") as i32, -468_965_076);
        assert_eq!(partition_for("a", 3), 0);
        assert_ne!(fnv1a32("a") % 3, partition_for("a", 3));
        // 0x811c9dc5 as i32 = -2128831035: floorMod(.., 3) = 0 too; unsigned says 1.
        assert_eq!(partition_for("", 3), 0);
        assert_eq!(fnv1a32("") % 3, 1);
        // A power of two: both readings agree.
        for key in ["", "a", "foobar", "customer-17"] {
            assert_eq!(partition_for(key, 8), fnv1a32(key) % 8, "{key}");
        }
    }

    #[test]
    fn every_partition_is_in_range() {
        for n in 1..=13 {
            for k in 0..200 {
                assert!(partition_for(&format!("k{k}"), n) < n);
            }
        }
        assert_eq!(partition_for("x", 0), 0);
    }
}
