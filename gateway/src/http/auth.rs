//! API keys: which requests may use /v1/*, checked in constant
//! time, re-read when the file's content changes.
//!
//! The file holds one key a line (blank lines and # comments ignored); in Kubernetes it is a
//! mounted Secret, which the kubelet updates by swapping a symlink, so it is re-read by content
//! every `--api-keys-reload-seconds`. Only sha256 digests of the keys stay in memory; the
//! presented key's digest is compared with every stored one, with no early exit, so the time
//! taken says nothing about which key, or how much of one, matched. Keys never reach a log or a
//! metric: per-key counters carry `key_label` (12 hex digits of the sha256).

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How many hex digits of the key's sha256 label its metrics.
pub const LABEL_DIGITS: usize = 12;

/// Unicode's line boundaries (a "\r\n" leaves an empty piece, dropped as blank).
const LINE_BREAKS: &[char] = &[
    '\n', '\r', '\x0b', '\x0c', '\x1c', '\x1d', '\x1e', '\u{85}', '\u{2028}', '\u{2029}',
];

/// One key a line; surrounding whitespace, blank lines and lines starting with # dropped.
pub fn parse_keys(text: &str) -> Vec<String> {
    text.split(LINE_BREAKS)
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// What metrics call a key: the start of its sha256 (`printf %s KEY | sha256sum`).
pub fn key_label(key: &str) -> String {
    let mut hex = String::with_capacity(64);
    for byte in digest(key) {
        let _ = write!(hex, "{byte:02x}");
    }
    hex.truncate(LABEL_DIGITS);
    hex
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), the header
/// read as latin-1 as HTTP allows.
pub fn bearer(authorization: Option<&[u8]>) -> Option<String> {
    let raw = authorization.filter(|a| !a.is_empty())?;
    let text: String = raw.iter().map(|&b| char::from(b)).collect();
    let text = text.trim();
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    let token = token.trim();
    (scheme.to_lowercase() == "bearer" && !token.is_empty()).then(|| token.to_string())
}

/// A set of keys, as digests. `check` answers the matching key's label, or None.
pub struct ApiKeys {
    entries: Vec<([u8; 32], Arc<str>)>,
}

impl ApiKeys {
    pub fn new(keys: &[String]) -> Self {
        let mut entries: Vec<([u8; 32], Arc<str>)> = Vec::with_capacity(keys.len());
        for key in keys {
            let d = digest(key);
            if !entries.iter().any(|(seen, _)| *seen == d) {
                entries.push((d, Arc::from(key_label(key))));
            }
        }
        ApiKeys { entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn check(&self, presented: Option<&str>) -> Option<Arc<str>> {
        let candidate = digest(presented?);
        let mut found = None;
        for (stored, label) in &self.entries {
            // Every entry and every byte is compared, whether or not one already matched.
            let diff = stored
                .iter()
                .zip(candidate.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(diff) == 0 {
                found = Some(Arc::clone(label));
            }
        }
        found
    }
}

/// The keys of a file, re-read whenever its content changes; `keys()` is the current set.
///
/// A file that cannot be read (or is not UTF-8) at start is an error: a gateway that should
/// check keys must not start open. One that vanishes later (mid-swap, say) keeps the last keys.
pub struct KeyFile {
    path: PathBuf,
    interval: Duration,
    raw: Mutex<Vec<u8>>,
    keys: RwLock<Arc<ApiKeys>>,
    failing: AtomicBool,
    pub reloads: AtomicU64,
}

impl KeyFile {
    pub fn open(path: &str, interval_seconds: f64) -> Result<Self, String> {
        let raw = std::fs::read(path).map_err(|e| format!("--api-keys-file {path}: {e}"))?;
        let text = std::str::from_utf8(&raw)
            .map_err(|e| format!("--api-keys-file {path}: not UTF-8 ({e})"))?;
        let keys = ApiKeys::new(&parse_keys(text));
        tracing::info!(keys = keys.len(), "api keys loaded");
        // A zero interval would spin.
        let interval = Duration::from_secs_f64(interval_seconds.max(0.01));
        Ok(KeyFile {
            path: PathBuf::from(path),
            interval,
            raw: Mutex::new(raw),
            keys: RwLock::new(Arc::new(keys)),
            failing: AtomicBool::new(false),
            reloads: AtomicU64::new(0),
        })
    }

    pub fn keys(&self) -> Arc<ApiKeys> {
        Arc::clone(&self.keys.read().expect("keys lock"))
    }

    /// Re-reads the file; true when the keys changed.
    pub fn reload(&self) -> bool {
        let raw = match std::fs::read(&self.path) {
            Ok(raw) => raw,
            Err(e) => {
                // Once per failure streak: the loop polls every second.
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = ?e.kind(),
                        "api keys file unreadable; keeping the last keys",
                    );
                }
                return false;
            }
        };
        self.failing.store(false, Ordering::Relaxed);
        let mut last = self.raw.lock().expect("raw lock");
        if *last == raw {
            return false;
        }
        let keys = ApiKeys::new(&parse_keys(&String::from_utf8_lossy(&raw)));
        *last = raw;
        tracing::info!(keys = keys.len(), "api keys reloaded");
        *self.keys.write().expect("keys lock") = Arc::new(keys);
        self.reloads.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Polls the file on the current runtime for as long as the process runs.
    pub fn start(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(me.interval).await;
                me.reload();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_one_a_line_comments_and_blanks_dropped() {
        let text = "  alpha \n\n# a comment\r\nbeta\rgamma\u{2028}#x\n";
        assert_eq!(parse_keys(text), vec!["alpha", "beta", "gamma"]);
    }

    #[test]
    fn label_is_the_start_of_the_sha256() {
        // printf %s abc | sha256sum
        assert_eq!(key_label("abc"), "ba7816bf8f01");
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_needs_a_token() {
        assert_eq!(bearer(Some(b"Bearer k1")), Some("k1".to_string()));
        assert_eq!(bearer(Some(b"  bEaReR   k1  ")), Some("k1".to_string()));
        assert_eq!(bearer(Some(b"Basic k1")), None);
        assert_eq!(bearer(Some(b"Bearer")), None);
        assert_eq!(bearer(Some(b"Bearer   ")), None);
        assert_eq!(bearer(Some(b"")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn check_answers_the_matching_keys_label() {
        let keys = ApiKeys::new(&["k1".to_string(), "k2".to_string(), "k1".to_string()]);
        assert_eq!(keys.len(), 2);
        assert_eq!(
            keys.check(Some("k2")).as_deref(),
            Some(key_label("k2").as_str())
        );
        assert_eq!(keys.check(Some("k3")), None);
        assert_eq!(keys.check(None), None);
    }

    #[test]
    fn a_file_is_reloaded_by_content_and_kept_when_it_vanishes() {
        let dir = std::env::temp_dir().join(format!("embedfleet-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        std::fs::write(&path, "k1\n").unwrap();
        let file = KeyFile::open(path.to_str().unwrap(), 1.0).unwrap();
        assert!(file.keys().check(Some("k1")).is_some());
        assert!(!file.reload());
        std::fs::write(&path, "k2\n").unwrap();
        assert!(file.reload());
        assert!(file.keys().check(Some("k1")).is_none());
        assert!(file.keys().check(Some("k2")).is_some());
        std::fs::remove_file(&path).unwrap();
        assert!(!file.reload());
        assert!(file.keys().check(Some("k2")).is_some());
        assert_eq!(file.reloads.load(Ordering::Relaxed), 1);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(KeyFile::open(path.to_str().unwrap(), 1.0).is_err());
    }
}
