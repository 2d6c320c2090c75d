//! The encrypting codec (feature `encryption`): AES-256-GCM over another codec's bytes, in
//! the family's framing, so a Java, .NET, Go, Python or Ruby member opens what Rust seals
//! and the other way round.
//!
//! This module owns the framing, the [`Keyring`] and [`key_id_of`]. The body is
//!
//! ```text
//! AE 01 {len: 1 byte} {key id: len bytes of UTF-8} {nonce: 12 bytes} {ciphertext ‖ 16-byte tag}
//! ```
//!
//! and the associated data (authenticated, not encrypted) is the header before the nonce,
//! `AE 01 {len} {key id}`: the key id is readable without a key but cannot be changed. A
//! fresh random nonce is drawn for every message (`rand`'s thread-local CSPRNG). The
//! content type is `application/vnd.acemq.encrypted`, the Java member's (`docs/encryption.md`);
//! no header names the inner format: the reader's inner codec decodes the opened bytes as
//! its own format.
//!
//! A body that is not in the framing, names a key the keyring lacks, or fails
//! authentication (wrong key, altered bytes) is an [`Error::Decode`] whose reason says
//! which, so the consumer parks it in `{q}.parked`: never a panic, never a wrong payload.
//! The crate is RustCrypto's `aes-gcm` (maintained, audited by NCC Group, constant-time
//! with the `aes` backend).

use ::bytes::{BufMut, Bytes, BytesMut};
use aes_gcm::Nonce;
use aes_gcm::aead::{Aead, Payload};
use rand::Rng;

use super::{Decoder, Encoder, essence, given};
use crate::error::Error;

mod keyring;

pub use keyring::{Key, Keyring, KeyringBuilder};

/// `application/vnd.acemq.encrypted`
pub const ENCRYPTED: &str = "application/vnd.acemq.encrypted";

/// The two magic bytes every encrypted body starts with.
pub const MAGIC: [u8; 2] = [0xAE, 0x01];

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Why a key, a keyring or a body was refused. Converts into [`Error::Decode`] (a body) or
/// [`Error::Encode`] (sealing), so a consumer parks the message with this text.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncryptionError {
    /// A key id must be 1 to 255 bytes of UTF-8 (it is framed with a one-byte length).
    #[error("a key id must be 1 to 255 bytes of UTF-8, not {len}")]
    InvalidKeyId {
        /// The length given.
        len: usize,
    },
    /// AES-256 keys are 32 bytes.
    #[error("an AES-256 key is 32 bytes, not {len}: generate 32 random bytes")]
    InvalidKeyLength {
        /// The length given.
        len: usize,
    },
    /// A keyring needs the key new bodies are sealed under.
    #[error("the keyring has no current key: call KeyringBuilder::current")]
    NoCurrentKey,
    /// Two keys of one keyring share an id.
    #[error("two keys share the id {id:?}: key ids must be unique in a keyring")]
    DuplicateKeyId {
        /// The id.
        id: String,
    },
    /// The body does not start with `AE 01` or is cut short.
    #[error(
        "the body is not in the AceMQ encryption framing (AE 01 {{len}} {{key id}} {{nonce}} {{ciphertext}}): {detail}"
    )]
    NotFramed {
        /// What is wrong with it.
        detail: String,
    },
    /// The body was sealed under a key id this keyring lacks.
    #[error(
        "the body was encrypted with key {key_id:?}, which this keyring does not hold: add that key to the consumer's keyring (Keyring::builder().older(..)) and replay it"
    )]
    UnknownKey {
        /// The key id the body names.
        key_id: String,
    },
    /// Authentication failed: the body was altered, or sealed under another key that has
    /// the same id.
    #[error(
        "the body failed authentication under key {key_id:?}: it was altered in transit or encrypted with a different key of that id; it was not decrypted"
    )]
    Tampered {
        /// The key id the body names.
        key_id: String,
    },
    /// The cipher refused to seal (only for absurd sizes).
    #[error("AES-GCM could not seal the payload")]
    Seal,
}

impl From<EncryptionError> for Error {
    fn from(e: EncryptionError) -> Self {
        match e {
            EncryptionError::Seal => Error::Encode {
                content_type: ENCRYPTED.into(),
                reason: e.to_string(),
            },
            other => Error::Decode {
                reason: other.to_string(),
            },
        }
    }
}

/// An encrypting codec around another codec: writes `application/vnd.acemq.encrypted`
/// with the keyring's current key; reads bodies sealed under any key of the keyring, then
/// hands the opened bytes to the inner codec.
///
/// ```
/// use acemq::codec::{Decoder, Encoder, Json};
/// use acemq::codec::encrypt::{Encrypted, Key, Keyring, key_id_of};
/// let codec = Encrypted::wrapping(Json, Keyring::of(Key::new("k1", [9u8; 32]).unwrap()));
/// let body = codec.encode(&vec![1, 2]).unwrap();
/// assert_eq!(key_id_of(&body).unwrap(), "k1");
/// assert_eq!(Encoder::<Vec<i32>>::content_type(&codec), "application/vnd.acemq.encrypted");
/// let v: Vec<i32> = codec.decode(Some("application/vnd.acemq.encrypted"), &body).unwrap();
/// assert_eq!(v, [1, 2]);
/// ```
#[derive(Clone, Debug)]
pub struct Encrypted<C> {
    inner: C,
    keyring: Keyring,
}

impl<C> Encrypted<C> {
    /// Wraps `inner` with a keyring.
    pub fn wrapping(inner: C, keyring: Keyring) -> Self {
        Encrypted { inner, keyring }
    }

    /// The keyring.
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Whether a body with this content type is one this codec opens: the encrypted type,
    /// or none at all (the framing is then checked on decode).
    ///
    /// ```
    /// use acemq::codec::Json;
    /// use acemq::codec::encrypt::{Encrypted, Key, Keyring};
    /// let c = Encrypted::wrapping(Json, Keyring::of(Key::new("k", [0; 32]).unwrap()));
    /// assert!(c.accepts(Some("application/vnd.acemq.encrypted")));
    /// assert!(!c.accepts(Some("application/json")));
    /// ```
    pub fn accepts(&self, content_type: Option<&str>) -> bool {
        given(content_type).is_none_or(|ct| essence(ct) == ENCRYPTED)
    }
}

impl<T: ?Sized, C: Encoder<T>> Encoder<T> for Encrypted<C> {
    fn content_type(&self) -> &str {
        ENCRYPTED
    }
    fn encode(&self, value: &T) -> Result<Bytes, Error> {
        let plain = self.inner.encode(value)?;
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        Ok(seal(self.keyring.current(), nonce, &plain)?)
    }
}

impl<T, C: Decoder<T>> Decoder<T> for Encrypted<C> {
    fn expects(&self) -> &str {
        "encrypted"
    }
    fn accepts(&self, content_type: Option<&str>) -> bool {
        Encrypted::accepts(self, content_type)
    }
    fn decode(&self, content_type: Option<&str>, body: &[u8]) -> Result<T, Error> {
        if !Encrypted::accepts(self, content_type) {
            return Err(super::refused(content_type.unwrap_or(""), "encrypted"));
        }
        let plain = open(&self.keyring, body)?;
        self.inner.decode(None, &plain)
    }
}

/// The key id an encrypted body was sealed under, read without any key (for an operator
/// deciding which key a parked message needs).
///
/// ```
/// use acemq::codec::encrypt::key_id_of;
/// let body = [0xAE, 0x01, 2, b'k', b'1'].iter().copied().chain([0u8; 28]).collect::<Vec<_>>();
/// assert_eq!(key_id_of(&body).unwrap(), "k1");
/// assert!(key_id_of(b"{}").is_err());
/// ```
pub fn key_id_of(body: &[u8]) -> Result<&str, EncryptionError> {
    Ok(parse(body)?.key_id)
}

/// Whether a body starts with the encryption magic `AE 01`.
///
/// ```
/// assert!(acemq::codec::encrypt::is_encrypted(&[0xAE, 0x01, 0]));
/// assert!(!acemq::codec::encrypt::is_encrypted(b"{}"));
/// ```
pub fn is_encrypted(body: &[u8]) -> bool {
    body.starts_with(&MAGIC)
}

/// A body split into its parts.
struct Framed<'a> {
    header: &'a [u8],
    key_id: &'a str,
    nonce: &'a [u8],
    sealed: &'a [u8],
}

fn not_framed(detail: impl Into<String>) -> EncryptionError {
    EncryptionError::NotFramed {
        detail: detail.into(),
    }
}

fn parse(body: &[u8]) -> Result<Framed<'_>, EncryptionError> {
    if !is_encrypted(body) {
        return Err(not_framed("it does not start with AE 01"));
    }
    let len = *body.get(2).ok_or_else(|| not_framed("no key id length"))? as usize;
    let header_end = 3 + len;
    let min = header_end + NONCE_LEN + TAG_LEN;
    if len == 0 || body.len() < min {
        return Err(not_framed(format!(
            "{} bytes, shorter than its key id, nonce and tag ({min})",
            body.len()
        )));
    }
    let key_id = std::str::from_utf8(&body[3..header_end])
        .map_err(|_| not_framed("the key id is not UTF-8"))?;
    Ok(Framed {
        header: &body[..header_end],
        key_id,
        nonce: &body[header_end..header_end + NONCE_LEN],
        sealed: &body[header_end + NONCE_LEN..],
    })
}

/// Seals `plain` under `key` with `nonce`: the whole framed body.
fn seal(key: &Key, nonce: [u8; NONCE_LEN], plain: &[u8]) -> Result<Bytes, EncryptionError> {
    let id = key.id().as_bytes();
    let len =
        u8::try_from(id.len()).map_err(|_| EncryptionError::InvalidKeyId { len: id.len() })?;
    let mut out = BytesMut::with_capacity(3 + id.len() + NONCE_LEN + plain.len() + TAG_LEN);
    out.put_slice(&MAGIC);
    out.put_u8(len);
    out.put_slice(id);
    let sealed = key
        .cipher()
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plain,
                aad: &out,
            },
        )
        .map_err(|_| EncryptionError::Seal)?;
    out.put_slice(&nonce);
    out.put_slice(&sealed);
    Ok(out.freeze())
}

/// Opens a framed body with the key its id names.
fn open(keyring: &Keyring, body: &[u8]) -> Result<Vec<u8>, EncryptionError> {
    let framed = parse(body)?;
    let key = keyring
        .get(framed.key_id)
        .ok_or_else(|| EncryptionError::UnknownKey {
            key_id: framed.key_id.to_owned(),
        })?;
    key.cipher()
        .decrypt(
            Nonce::from_slice(framed.nonce),
            Payload {
                msg: framed.sealed,
                aad: framed.header,
            },
        )
        .map_err(|_| EncryptionError::Tampered {
            key_id: framed.key_id.to_owned(),
        })
}

#[cfg(test)]
mod tests;
