//! Workers from a Kubernetes Service's EndpointSlices (`--k8s-service`): one list, then a watch
//! from the list's resourceVersion (JSON lines over one HTTPS connection), relisting after an error
//! or the server's end of the watch; the pod's service-account token and CA, or a kubeconfig's
//! current context (CA data or file; a token, or a client certificate as data or files).
//!
//! A plain HTTP/1.1 GET over rustls, no client library: one list+watch of one resource.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

use crate::upstream::pool::Pool;

/// The service-account files of a pod.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The server ends a watch after this; a read gap past `READ_TIMEOUT` means the link is gone.
const WATCH_SECONDS: u32 = 300;
const READ_TIMEOUT: Duration = Duration::from_secs(330);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

// --- pure parts ---------------------------------------------------------------------------------

/// Whether a Service port is one engine's: `port_name`, or `port_name`-N for the further engine
/// processes of a pod (the operator's enginesPerGPU), each a worker of its own.
pub fn engine_port(name: &str, port_name: &str) -> bool {
    name == port_name
        || name
            .strip_prefix(port_name)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn host_port(address: &str, port: u64) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// host:port of every engine of every endpoint in the slice that is ready (or not known to be
/// unready: the API's meaning of a missing condition); terminating endpoints are not ready.
pub fn slice_addresses(slice: &Value, port_name: &str) -> BTreeSet<String> {
    let mut ports: Vec<u64> = slice["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| engine_port(p["name"].as_str().unwrap_or(""), port_name))
        .filter_map(|p| p["port"].as_u64().filter(|&n| n > 0))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let mut out = BTreeSet::new();
    for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
        if endpoint["conditions"]["ready"] == Value::Bool(false) {
            continue;
        }
        for address in endpoint["addresses"].as_array().into_iter().flatten() {
            if let Some(a) = address.as_str() {
                out.extend(ports.iter().map(|&p| host_port(a, p)));
            }
        }
    }
    out
}

/// The Service's slices by name; the union of their addresses is the worker set.
#[derive(Default)]
pub struct SliceSet {
    slices: HashMap<String, BTreeSet<String>>,
}

impl SliceSet {
    fn name(obj: &Value) -> String {
        obj["metadata"]["name"].as_str().unwrap_or("").to_string()
    }

    pub fn reset(&mut self, items: &[Value], port_name: &str) {
        self.slices = items
            .iter()
            .map(|s| (Self::name(s), slice_addresses(s, port_name)))
            .collect();
    }

    /// One watch event; false for those that carry no slice (BOOKMARK).
    pub fn apply(&mut self, kind: &str, obj: &Value, port_name: &str) -> bool {
        match kind {
            "ADDED" | "MODIFIED" => {
                self.slices
                    .insert(Self::name(obj), slice_addresses(obj, port_name));
                true
            }
            "DELETED" => {
                self.slices.remove(&Self::name(obj));
                true
            }
            _ => false,
        }
    }

    pub fn addresses(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.slices.values().flatten().collect();
        all.into_iter().cloned().collect()
    }
}

/// (namespace, name) of NAMESPACE/NAME, or of NAME in `default_namespace`.
pub fn parse_service(value: &str, default_namespace: &str) -> (String, String) {
    match value.rsplit_once('/') {
        Some((ns, name)) if !ns.is_empty() => (ns.to_string(), name.to_string()),
        Some((_, name)) => (default_namespace.to_string(), name.to_string()),
        None => (default_namespace.to_string(), value.to_string()),
    }
}

/// A query value percent-encoded (everything but RFC 3986's unreserved characters).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// (host, port) of an https:// server URL; IPv6 hosts in brackets.
pub fn https_server(url: &str) -> Result<(String, u16), String> {
    let bad = |why: &str| format!("Kubernetes API server {url:?}: {why}");
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| bad("only https:// is supported"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let port = |p: Option<&str>| match p {
        None => Ok(443),
        Some(p) => p.parse::<u16>().map_err(|_| bad("bad port")),
    };
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (host, after) = inner.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        if !after.is_empty() && !after.starts_with(':') {
            return Err(bad("bad port"));
        }
        (host, port(after.strip_prefix(':'))?)
    } else {
        let (host, p) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        (host, port(p)?)
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((host.to_string(), port))
}

// --- access -------------------------------------------------------------------------------------

/// Where the API is and how to authenticate to it.
pub struct Access {
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    /// the Authorization header's value, if a token authenticates
    bearer: Option<String>,
    pub namespace: String,
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: {e:?}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no certificate"));
    }
    Ok(certs)
}

fn tls_config(
    ca: &[u8],
    client: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca, "the cluster's CA")? {
        roots
            .add(cert)
            .map_err(|e| format!("the cluster's CA: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => {
            let chain = certificates(&cert, "the client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| format!("the client key: {e:?}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn decode64(value: &serde_yaml::Value, what: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let text = value
        .as_str()
        .ok_or_else(|| format!("{what}: not a string"))?;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("{what}: {e}"))
}

/// The kubeconfig's current context: server, CA, credentials, namespace.
fn from_kubeconfig(path: &Path) -> Result<Access, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let named = |list: &str, name: &serde_yaml::Value, field: &str| {
        doc[list]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|item| &item["name"] == name)
            .map(|item| item[field].clone())
            .ok_or_else(|| format!("{}: no {list} entry {name:?}", path.display()))
    };
    let context = named("contexts", &doc["current-context"], "context")?;
    let cluster = named("clusters", &context["cluster"], "cluster")?;
    let user = named("users", &context["user"], "user")?;
    // Relative file paths in a kubeconfig are relative to the file.
    let base = path.parent().unwrap_or(Path::new("."));
    let file = |v: &serde_yaml::Value| v.as_str().map(|p| base.join(p));
    let ca = match (
        cluster.get("certificate-authority-data"),
        file(&cluster["certificate-authority"]),
    ) {
        (Some(data), _) => decode64(data, "certificate-authority-data")?,
        (None, Some(f)) => read(&f)?,
        (None, None) => return Err(format!("{}: the cluster names no CA", path.display())),
    };
    let cert = match (
        user.get("client-certificate-data"),
        file(&user["client-certificate"]),
    ) {
        (Some(data), _) => Some(decode64(data, "client-certificate-data")?),
        (None, Some(f)) => Some(read(&f)?),
        (None, None) => None,
    };
    let key = match (user.get("client-key-data"), file(&user["client-key"])) {
        (Some(data), _) => Some(decode64(data, "client-key-data")?),
        (None, Some(f)) => Some(read(&f)?),
        (None, None) => None,
    };
    let server = cluster["server"]
        .as_str()
        .ok_or_else(|| format!("{}: the cluster has no server", path.display()))?;
    let (host, port) = https_server(server.trim_end_matches('/'))?;
    Ok(Access {
        host,
        port,
        tls: tls_config(&ca, cert.zip(key))?,
        bearer: user["token"].as_str().map(|t| format!("Bearer {t}")),
        namespace: context["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
    })
}

/// `--kubeconfig`, else the pod's service account, else $KUBECONFIG. Read on every (re)connect:
/// projected tokens rotate.
pub fn access(kubeconfig: &str) -> Result<Access, String> {
    let sa = PathBuf::from(SA_DIR);
    let path = if !kubeconfig.is_empty() {
        kubeconfig.to_string()
    } else if sa.join("token").exists() {
        String::new()
    } else {
        std::env::var("KUBECONFIG").unwrap_or_default()
    };
    if !path.is_empty() {
        return from_kubeconfig(Path::new(&path));
    }
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .map_err(|_| "no --kubeconfig, no $KUBECONFIG and KUBERNETES_SERVICE_HOST unset")?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let token = String::from_utf8_lossy(&read(&sa.join("token"))?)
        .trim()
        .to_string();
    let namespace = String::from_utf8_lossy(&read(&sa.join("namespace"))?)
        .trim()
        .to_string();
    Ok(Access {
        host,
        port: port
            .parse()
            .map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?}"))?,
        tls: tls_config(&read(&sa.join("ca.crt"))?, None)?,
        bearer: Some(format!("Bearer {token}")),
        namespace,
    })
}

// --- the watch ----------------------------------------------------------------------------------

/// GET `path` (with its query) on a connection of its own; the response, checked for 2xx.
async fn get(access: &Access, path: &str) -> Result<hyper::Response<Incoming>, String> {
    let address = (access.host.as_str(), access.port);
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(access.host.clone()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&access.tls));
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let authority = host_port(&access.host, u64::from(access.port));
    let mut request = Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "application/json");
    if let Some(bearer) = &access.bearer {
        request = request.header(hyper::header::AUTHORIZATION, bearer);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(CONNECT_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| "no response in time".to_string())?
        .map_err(|e| format!("HTTP: {e}"))?;
    if !reply.status().is_success() {
        return Err(format!("GET {path}: {}", reply.status()));
    }
    Ok(reply)
}

/// One list, then watches from its version until one fails (the caller lists again).
async fn list_and_watch(
    pool: &Arc<Pool>,
    service: &str,
    port_name: &str,
    access: &Access,
) -> Result<(), String> {
    let (namespace, name) = parse_service(service, &access.namespace);
    let base = format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices");
    let selector = format!(
        "labelSelector={}",
        encode(&format!("kubernetes.io/service-name={name}"))
    );
    let listed = get(access, &format!("{base}?{selector}")).await?;
    let body = tokio::time::timeout(READ_TIMEOUT, listed.into_body().collect())
        .await
        .map_err(|_| "list read timed out".to_string())?
        .map_err(|e| format!("list: {e}"))?
        .to_bytes();
    let doc: Value = serde_json::from_slice(&body).map_err(|e| format!("list: {e}"))?;
    let mut slices = SliceSet::default();
    let items = doc["items"].as_array().cloned().unwrap_or_default();
    slices.reset(&items, port_name);
    pool.update(&slices.addresses());
    let mut version = doc["metadata"]["resourceVersion"]
        .as_str()
        .ok_or("list: no resourceVersion")?
        .to_string();
    loop {
        let path = format!(
            "{base}?{selector}&watch=1&resourceVersion={}&allowWatchBookmarks=true&\
             timeoutSeconds={WATCH_SECONDS}",
            encode(&version)
        );
        let mut body = get(access, &path).await?.into_body();
        let mut pending = BytesMut::new();
        loop {
            let frame = match tokio::time::timeout(READ_TIMEOUT, body.frame()).await {
                Err(_) => return Err("watch read timed out".into()),
                Ok(None) => break, // the server ended this watch: watch again from `version`
                Ok(Some(frame)) => frame.map_err(|e| format!("watch: {e}"))?,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = pending.split_to(end + 1);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: Value =
                    serde_json::from_slice(&line).map_err(|e| format!("watch event: {e}"))?;
                let obj = &event["object"];
                let kind = event["type"].as_str().unwrap_or("");
                if kind == "ERROR" {
                    // Usually 410 Gone: our version is too old; list again.
                    return Err(format!("watch error: {}", obj["message"]));
                }
                if let Some(v) = obj["metadata"]["resourceVersion"].as_str() {
                    version = v.to_string();
                }
                if slices.apply(kind, obj, port_name) {
                    pool.update(&slices.addresses());
                }
            }
        }
    }
}

/// Follows the Service's slices for as long as the process runs, relisting after each failure
/// with a backoff from half a second to ten.
pub fn start(pool: &Arc<Pool>, service: String, port_name: String, kubeconfig: String) {
    let pool = Arc::clone(pool);
    tokio::spawn(async move {
        let mut backoff = 0.5f64;
        loop {
            let done = match access(&kubeconfig) {
                Ok(access) => list_and_watch(&pool, &service, &port_name, &access).await,
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, retry_seconds = backoff, "endpointslice watch failed");
            }
            tokio::time::sleep(Duration::from_secs_f64(backoff)).await;
            backoff = (backoff * 2.0).min(10.0);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn engine_ports_are_the_name_and_numbered_siblings() {
        assert!(engine_port("grpc", "grpc"));
        assert!(engine_port("grpc-1", "grpc"));
        assert!(engine_port("grpc-12", "grpc"));
        assert!(!engine_port("grpc-", "grpc"));
        assert!(!engine_port("grpc-x", "grpc"));
        assert!(!engine_port("metrics", "grpc"));
        assert!(!engine_port("grpcx", "grpc"));
    }

    #[test]
    fn slices_keep_ready_and_unknown_endpoints_and_drop_unready_ones() {
        let slice = json!({
            "metadata": {"name": "s"},
            "ports": [{"name": "grpc", "port": 50051}, {"name": "metrics", "port": 9090}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
                {"addresses": ["fd00::4"], "conditions": {}},
            ],
        });
        let got: Vec<String> = slice_addresses(&slice, "grpc").into_iter().collect();
        assert_eq!(got, ["10.0.0.1:50051", "10.0.0.2:50051", "[fd00::4]:50051"]);
        assert!(slice_addresses(&json!({"ports": null}), "grpc").is_empty());
    }

    #[test]
    fn a_pod_with_several_engines_gives_one_address_per_engine_port() {
        let slice = json!({
            "ports": [{"name": "grpc-1", "port": 50052}, {"name": "grpc", "port": 50051}],
            "endpoints": [{"addresses": ["10.0.0.1"]}],
        });
        let got: Vec<String> = slice_addresses(&slice, "grpc").into_iter().collect();
        assert_eq!(got, ["10.0.0.1:50051", "10.0.0.1:50052"]);
    }

    #[test]
    fn the_slice_set_follows_events() {
        let slice = |name: &str, ip: &str| {
            json!({"metadata": {"name": name}, "ports": [{"name": "grpc", "port": 1}],
                   "endpoints": [{"addresses": [ip]}]})
        };
        let mut set = SliceSet::default();
        set.reset(&[slice("a", "10.0.0.1")], "grpc");
        assert!(set.apply("ADDED", &slice("b", "10.0.0.2"), "grpc"));
        assert_eq!(set.addresses(), ["10.0.0.1:1", "10.0.0.2:1"]);
        assert!(set.apply("MODIFIED", &slice("a", "10.0.0.2"), "grpc"));
        assert_eq!(set.addresses(), ["10.0.0.2:1"]);
        assert!(!set.apply("BOOKMARK", &json!({}), "grpc"));
        assert!(set.apply("DELETED", &slice("b", ""), "grpc"));
        assert!(set.apply("DELETED", &slice("a", ""), "grpc"));
        assert!(set.addresses().is_empty());
    }

    #[test]
    fn services_servers_and_queries() {
        assert_eq!(parse_service("ns/svc", "d"), ("ns".into(), "svc".into()));
        assert_eq!(parse_service("svc", "d"), ("d".into(), "svc".into()));
        assert_eq!(
            https_server("https://127.0.0.1:6443"),
            Ok(("127.0.0.1".into(), 6443))
        );
        assert_eq!(
            https_server("https://kubernetes.default.svc"),
            Ok(("kubernetes.default.svc".into(), 443))
        );
        assert_eq!(https_server("https://[::1]:6443"), Ok(("::1".into(), 6443)));
        assert_eq!(https_server("https://[::1]"), Ok(("::1".into(), 443)));
        assert!(https_server("http://127.0.0.1:8080").is_err());
        assert_eq!(
            encode("kubernetes.io/service-name=w"),
            "kubernetes.io%2Fservice-name%3Dw"
        );
    }
}
