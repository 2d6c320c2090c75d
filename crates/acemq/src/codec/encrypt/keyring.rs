//! Keys and keyrings: which AES-256 key seals new bodies, and which ones still open old ones.

use std::collections::HashMap;
use std::sync::Arc;

use aes_gcm::{Aes256Gcm, KeyInit};

use super::EncryptionError;

/// One AES-256 key and its id. The id travels in the clear (authenticated) in every body it
/// seals; the key bytes never appear in `Debug`, errors or logs.
///
/// ```
/// use acemq::codec::encrypt::Key;
/// let k = Key::new("2026-01", [7u8; 32]).unwrap();
/// assert_eq!(k.id(), "2026-01");
/// assert!(!format!("{k:?}").contains('7'));
/// ```
#[derive(Clone)]
pub struct Key {
    id: String,
    cipher: Aes256Gcm,
}

impl Key {
    /// A key from its id (1 to 255 bytes of UTF-8) and its 32 bytes.
    pub fn new(id: impl Into<String>, secret: [u8; 32]) -> Result<Key, EncryptionError> {
        let id = id.into();
        if id.is_empty() || id.len() > 255 {
            return Err(EncryptionError::InvalidKeyId { len: id.len() });
        }
        Ok(Key {
            id,
            cipher: Aes256Gcm::new(&secret.into()),
        })
    }

    /// A key from a slice, which must be exactly 32 bytes (AES-256).
    ///
    /// ```
    /// use acemq::codec::encrypt::Key;
    /// assert!(Key::from_slice("k1", &[0u8; 32]).is_ok());
    /// assert!(Key::from_slice("k1", &[0u8; 16]).is_err());
    /// ```
    pub fn from_slice(id: impl Into<String>, secret: &[u8]) -> Result<Key, EncryptionError> {
        let bytes: [u8; 32] = secret
            .try_into()
            .map_err(|_| EncryptionError::InvalidKeyLength { len: secret.len() })?;
        Key::new(id, bytes)
    }

    /// The key id.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn cipher(&self) -> &Aes256Gcm {
        &self.cipher
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The keys of an encrypting codec: the current one seals every new body; every key (the
/// current one and older ones) opens bodies sealed under its id.
///
/// Rotation, as the family does it: add the new key to every reader's keyring first
/// (as an older key), then make it current on the writers; drop the old key once nothing
/// sealed under it is left in any queue.
///
/// ```
/// use acemq::codec::encrypt::{Key, Keyring};
/// let ring = Keyring::builder()
///     .older(Key::new("k1", [1u8; 32]).unwrap())
///     .current(Key::new("k2", [2u8; 32]).unwrap())
///     .build()
///     .unwrap();
/// assert_eq!(ring.current_id(), "k2");
/// assert!(ring.has("k1") && ring.has("k2"));
/// ```
#[derive(Clone, Debug)]
pub struct Keyring {
    current: Arc<Key>,
    keys: HashMap<String, Arc<Key>>,
}

impl Keyring {
    /// A keyring of one key, which is current.
    ///
    /// ```
    /// use acemq::codec::encrypt::{Key, Keyring};
    /// let ring = Keyring::of(Key::new("k1", [1u8; 32]).unwrap());
    /// assert_eq!(ring.current_id(), "k1");
    /// ```
    pub fn of(key: Key) -> Keyring {
        let key = Arc::new(key);
        let keys = HashMap::from([(key.id.clone(), key.clone())]);
        Keyring { current: key, keys }
    }

    /// A keyring with older keys besides the current one.
    pub fn builder() -> KeyringBuilder {
        KeyringBuilder::default()
    }

    /// The id new bodies are sealed under.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// Whether a key with this id is in the keyring.
    pub fn has(&self, id: &str) -> bool {
        self.keys.contains_key(id)
    }

    pub(super) fn current(&self) -> &Key {
        &self.current
    }

    pub(super) fn get(&self, id: &str) -> Option<&Key> {
        self.keys.get(id).map(|k| &**k)
    }
}

/// Builds a [`Keyring`]: [`older`](KeyringBuilder::older) older keys (decryption only) and set
/// the [`current`](KeyringBuilder::current) one.
///
/// ```
/// use acemq::codec::encrypt::{Key, Keyring};
/// let e = Keyring::builder().older(Key::new("k1", [1u8; 32]).unwrap()).build().unwrap_err();
/// assert!(e.to_string().contains("current"));
/// ```
#[derive(Debug, Default)]
pub struct KeyringBuilder {
    current: Option<Key>,
    older: Vec<Key>,
}

impl KeyringBuilder {
    /// Adds a key that opens bodies sealed under its id but seals nothing new.
    pub fn older(mut self, key: Key) -> Self {
        self.older.push(key);
        self
    }

    /// Sets the key new bodies are sealed under (it opens old ones too).
    pub fn current(mut self, key: Key) -> Self {
        self.current = Some(key);
        self
    }

    /// The keyring; refused without a current key, or when two keys share an id.
    pub fn build(self) -> Result<Keyring, EncryptionError> {
        let current = self.current.ok_or(EncryptionError::NoCurrentKey)?;
        let mut ring = Keyring::of(current);
        for key in self.older {
            if ring.keys.contains_key(&key.id) {
                return Err(EncryptionError::DuplicateKeyId { id: key.id });
            }
            ring.keys.insert(key.id.clone(), Arc::new(key));
        }
        Ok(ring)
    }
}
