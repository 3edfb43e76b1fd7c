//! Where the workers are: the static `--workers` list, a `--workers-file` re-read when it
//! changes, or a Kubernetes Service's EndpointSlices (`kube`), so workers are added and removed
//! live.

pub mod kube;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::settings::Settings;
use crate::upstream::pool::Pool;

/// How often the workers file's modification time and size are looked at.
const FILE_POLL: Duration = Duration::from_millis(500);

/// One host:port per line; blank lines and # comments ignored.
pub fn parse_workers_file(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

/// Gives the pool its workers: with a workers file the static list plus the file's, again
/// whenever the file changes; else with a Service its slices' ready engines; else the list.
pub fn start(pool: &Arc<Pool>, s: &Settings) {
    let fixed = s.workers.0.clone();
    let workers_file = s.workers_file.as_str();
    if workers_file.is_empty() {
        if s.k8s_service.is_empty() {
            pool.update(&fixed);
        } else {
            kube::start(
                pool,
                s.k8s_service.clone(),
                s.k8s_port_name.clone(),
                s.kubeconfig.clone(),
            );
        }
        return;
    }
    let (pool, path) = (Arc::clone(pool), PathBuf::from(workers_file));
    tokio::spawn(async move {
        let mut seen: Option<FileKey> = None;
        let mut failing = false;
        loop {
            match poll_file(&path, seen) {
                Ok(Poll::Unchanged) => {}
                Ok(Poll::Gone) => {
                    if seen.take().is_some() {
                        pool.update(&fixed);
                    }
                }
                Ok(Poll::Read(key, text)) => {
                    seen = Some(key);
                    failing = false;
                    let mut all = fixed.clone();
                    all.extend(parse_workers_file(&text));
                    pool.update(&all);
                }
                Err(e) => {
                    // Kept: the last set it read. Said once until it reads again.
                    if !failing {
                        tracing::warn!(
                            path = %path.display(),
                            error = %e,
                            "workers file unreadable; keeping the last set",
                        );
                    }
                    failing = true;
                }
            }
            tokio::time::sleep(FILE_POLL).await;
        }
    });
}

/// A file's modification time and size: it is read again when either changes.
type FileKey = (Option<SystemTime>, u64);

/// What one look at the workers file found.
enum Poll {
    Unchanged,
    Gone,
    Read(FileKey, String),
}

fn poll_file(path: &Path, seen: Option<FileKey>) -> std::io::Result<Poll> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Poll::Gone),
        Err(e) => return Err(e),
    };
    let key = (meta.modified().ok(), meta.len());
    if seen == Some(key) {
        return Ok(Poll::Unchanged);
    }
    Ok(Poll::Read(key, std::fs::read_to_string(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_file_lines_and_comments() {
        let text = "# fleet\n10.0.0.1:1\n\n 10.0.0.2:2  # b\n[::1]:3\n";
        assert_eq!(
            parse_workers_file(text),
            ["10.0.0.1:1", "10.0.0.2:2", "[::1]:3"]
        );
        assert!(parse_workers_file("# nothing\n\n").is_empty());
    }

    #[test]
    fn a_file_is_read_again_only_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("embedfleet-poll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("workers");
        assert!(matches!(poll_file(&path, None), Ok(Poll::Gone)));
        std::fs::write(&path, "10.0.0.1:1\n").unwrap();
        let Ok(Poll::Read(key, text)) = poll_file(&path, None) else {
            panic!("a new file is read");
        };
        assert_eq!(text, "10.0.0.1:1\n");
        assert!(matches!(poll_file(&path, Some(key)), Ok(Poll::Unchanged)));
        std::fs::write(&path, "10.0.0.1:1\n10.0.0.2:2\n").unwrap();
        assert!(matches!(poll_file(&path, Some(key)), Ok(Poll::Read(..))));
        // A directory where the file should be: unreadable, an error (warned once by the caller).
        assert!(poll_file(&dir, None).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
