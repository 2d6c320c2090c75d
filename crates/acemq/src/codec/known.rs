//! The family's content types, known whether or not their codec's feature is compiled in:
//! which format a content type names, and which cargo feature reads it.
//!
//! The codecs use these predicates for [`Decoder::accepts`](super::Decoder::accepts), and a
//! refusal names the missing feature ([`feature_for`]) so a body in a format this build
//! cannot read is parked with a reason that says what to enable.

use super::essence;

/// A family format whose codec sits behind a cargo feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Yaml,
    Toml,
    Xml,
    Avro,
    AvroRegistered,
    Protobuf,
    /// `application/vnd.acemq.encrypted` (feature `encryption`).
    Encrypted,
}

impl Format {
    /// The acemq cargo feature that compiles this format's codec.
    pub(crate) fn feature(self) -> &'static str {
        match self {
            Format::Yaml => "yaml",
            Format::Toml => "toml",
            Format::Xml => "xml",
            Format::Avro | Format::AvroRegistered => "avro",
            Format::Protobuf => "protobuf",
            Format::Encrypted => "encryption",
        }
    }

    /// Whether this build has the format's feature.
    fn compiled(self) -> bool {
        match self {
            Format::Yaml => cfg!(feature = "yaml"),
            Format::Toml => cfg!(feature = "toml"),
            Format::Xml => cfg!(feature = "xml"),
            Format::Avro | Format::AvroRegistered => cfg!(feature = "avro"),
            Format::Protobuf => cfg!(feature = "protobuf"),
            Format::Encrypted => cfg!(feature = "encryption"),
        }
    }

    /// Whether `content_type` (parameters ignored, case-insensitive) names this format, as
    /// the family reads it: the Java member's type and the aliases the family accepts
    /// (`docs/codecs.md`).
    pub(crate) fn names(self, content_type: &str) -> bool {
        let mime = essence(content_type);
        let m: &str = &mime;
        let app_suffix = |suffix: &str| m.starts_with("application/") && m.ends_with(suffix);
        match self {
            Format::Yaml => {
                matches!(
                    m,
                    "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml"
                ) || app_suffix("+yaml")
            }
            Format::Toml => matches!(m, "application/toml" | "text/toml") || app_suffix("+toml"),
            Format::Xml => matches!(m, "application/xml" | "text/xml") || app_suffix("+xml"),
            Format::Avro => {
                m.starts_with("avro/") || m == "application/avro" || app_suffix("+avro")
            }
            Format::AvroRegistered => m == super::AVRO_REGISTERED,
            Format::Protobuf => {
                matches!(
                    m,
                    "application/x-protobuf"
                        | "application/protobuf"
                        | "application/vnd.google.protobuf"
                ) || app_suffix("+protobuf")
            }
            Format::Encrypted => m == "application/vnd.acemq.encrypted",
        }
    }
}

const FORMATS: [Format; 7] = [
    Format::Yaml,
    Format::Toml,
    Format::Xml,
    Format::Avro,
    Format::AvroRegistered,
    Format::Protobuf,
    Format::Encrypted,
];

/// The acemq cargo feature a body in `content_type` needs when this build lacks it: `None`
/// when the content type is not one of the family's feature-gated formats or its feature is
/// on. A consumer's refusal names it ("content type application/x-yaml needs acemq's `yaml`
/// feature").
///
/// ```
/// use acemq::codec::feature_for;
/// assert_eq!(feature_for("application/json"), None);
/// if cfg!(not(feature = "encryption")) {
///     assert_eq!(feature_for("application/vnd.acemq.encrypted"), Some("encryption"));
/// }
/// if cfg!(not(feature = "yaml")) {
///     assert_eq!(feature_for("application/x-yaml"), Some("yaml"));
/// }
/// ```
pub fn feature_for(content_type: &str) -> Option<&'static str> {
    FORMATS
        .iter()
        .find(|f| f.names(content_type))
        .filter(|f| !f.compiled())
        .map(|f| f.feature())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_names_the_family_aliases() {
        let cases: [(Format, &[&str], &[&str]); 6] = [
            (
                Format::Yaml,
                &[
                    "application/yaml",
                    "application/x-yaml",
                    "TEXT/YAML",
                    "text/x-yaml; charset=utf-8",
                    "application/vnd.acme+yaml",
                ],
                &["application/json", "text/plain", "image/x+yaml"],
            ),
            (
                Format::Toml,
                &["application/toml", "text/toml", "application/vnd.acme+toml"],
                &["application/yaml", "text/tomlx"],
            ),
            (
                Format::Xml,
                &["application/xml", "text/xml", "application/atom+xml"],
                &["image/svg+xml", "application/json"],
            ),
            (
                Format::Avro,
                &[
                    "avro/binary",
                    "avro/json",
                    "application/avro",
                    "application/vnd.acme+avro",
                ],
                &["application/vnd.acemq.avro", "application/json"],
            ),
            (
                Format::AvroRegistered,
                &[
                    "application/vnd.acemq.avro",
                    "Application/VND.acemq.avro; v=1",
                ],
                &["avro/binary", "application/avro"],
            ),
            (
                Format::Protobuf,
                &[
                    "application/x-protobuf",
                    "application/protobuf",
                    "application/vnd.google.protobuf",
                    "application/vnd.acme+protobuf",
                ],
                &["application/json", "application/octet-stream"],
            ),
        ];
        for (format, yes, no) in cases {
            for ct in yes {
                assert!(format.names(ct), "{format:?} names {ct}");
            }
            for ct in no {
                assert!(!format.names(ct), "{format:?} does not name {ct}");
            }
        }
    }

    #[test]
    fn a_missing_feature_is_named_only_when_off() {
        assert_eq!(
            feature_for("application/x-yaml").is_some(),
            cfg!(not(feature = "yaml"))
        );
        assert_eq!(
            feature_for("application/vnd.acemq.avro"),
            (!cfg!(feature = "avro")).then_some("avro")
        );
        assert_eq!(feature_for("application/json"), None);
        assert_eq!(
            feature_for("application/vnd.acemq.encrypted"),
            (!cfg!(feature = "encryption")).then_some("encryption")
        );
    }
}
