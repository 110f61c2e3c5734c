//! An S3-compatible server on 127.0.0.1 for the suite (moto's server mode, from the project's Python
//! environment), and a proxy in front of it that injects faults: error statuses, throttling, delays,
//! connections dropped mid-upload, refused credentials. Every wait is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The access key the suite signs with (moto accepts any).
pub const ACCESS_KEY: &str = "ckpt-test-key";
/// The secret key the suite signs with; tests check it never appears in output.
pub const SECRET_KEY: &str = "ckpt-test-secret-do-not-print";

/// A moto S3 server on a free port of 127.0.0.1, stopped on drop.
pub struct MotoServer {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port on 127.0.0.1")
}

/// One HTTP/1.1 request to `127.0.0.1:port`, its status code (bounded by a 10 s timeout).
fn request(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))
}

impl MotoServer {
    /// Starts moto (`python -m moto.server`) and waits until it answers (at most 60 s). Panics, with the
    /// set-up command, when moto is not installed.
    pub fn start() -> MotoServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("moto.log");
        let port = free_port();
        let out = std::fs::File::create(&log).expect("moto's log file");
        let err = out.try_clone().expect("moto's log file");
        let child = Command::new(crate::python())
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start moto's server");
        let mut server = MotoServer { child, port, log, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "moto's S3 server exited ({status}) — is moto[server] installed? run `bash scripts/setup.sh`\n{}",
                    std::fs::read_to_string(&server.log).unwrap_or_default()
                );
            }
            if request(port, "GET", "/").is_ok() {
                return server;
            }
            assert!(Instant::now() < deadline, "moto's S3 server did not answer on 127.0.0.1:{port} within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates the bucket `name`.
    pub fn create_bucket(&self, name: &str) {
        let status = request(self.port, "PUT", &format!("/{name}")).expect("create a bucket");
        assert_eq!(status, 200, "creating bucket {name}");
    }

    /// The environment a client needs to reach `endpoint` (this server or a proxy in front of it): the
    /// standard `AWS_*` variables.
    pub fn env(endpoint: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", endpoint.to_owned()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fault a [`FaultProxy`] injects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    None,
    /// Answer requests with this status and S3 error code instead of forwarding them (`times`: the first
    /// so many requests, `None`: all of them; `method`: only requests of this method).
    Status {
        /// The HTTP status.
        status: u16,
        /// The S3 error code in the body (`SlowDown`, `InternalError`).
        code: &'static str,
        /// How many requests, from the first; `None`: every one.
        times: Option<usize>,
        /// Only requests of this method (`PUT`); `None`: every method.
        method: Option<&'static str>,
    },
    /// Hold every request this long before forwarding it.
    Delay(Duration),
    /// Close the connection after half the body of every request with a body of at least this many bytes
    /// (a server that dies mid-upload).
    DropUploads {
        /// The smallest body dropped.
        min_body: usize,
    },
    /// Refuse requests signed with this access key (403 `InvalidAccessKeyId`).
    RefuseKey(&'static str),
}

/// A proxy on a free port of 127.0.0.1 in front of an S3 server, injecting its [`Fault`]; stopped on drop.
pub struct FaultProxy {
    port: u16,
    fault: Arc<Mutex<Fault>>,
    seen: Arc<AtomicUsize>,
    injected: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts a proxy to `127.0.0.1:<upstream>` injecting `fault`.
    pub fn start(upstream: u16, fault: Fault) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let proxy = FaultProxy {
            port,
            fault: Arc::new(Mutex::new(fault)),
            seen: Arc::new(AtomicUsize::new(0)),
            injected: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (fault, seen, injected, stop) =
            (proxy.fault.clone(), proxy.seen.clone(), proxy.injected.clone(), proxy.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (fault, seen, injected) = (fault.clone(), seen.clone(), injected.clone());
                        std::thread::spawn(move || {
                            let _ = serve(client, upstream, &fault, &seen, &injected);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        proxy
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Replaces the fault.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().expect("the fault") = fault;
    }

    /// Requests received so far.
    pub fn seen(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }

    /// Requests a fault was injected into so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One request of `client`: read, then answered by the fault or forwarded (with `Connection: close`).
fn serve(
    client: TcpStream,
    upstream: u16,
    fault: &Mutex<Fault>,
    seen: &AtomicUsize,
    injected: &AtomicUsize,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let end = line == "\r\n";
        head.push(line);
        if end || head.len() > 200 {
            break;
        }
    }
    let n = seen.fetch_add(1, Ordering::Relaxed);
    let method = head.first().and_then(|l| l.split_whitespace().next()).unwrap_or("").to_owned();
    let header = |name: &str| {
        head.iter().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let current = fault.lock().map(|f| f.clone()).unwrap_or(Fault::None);
    let mut client = client;
    let answer = |client: &mut TcpStream, status: u16, code: &str| -> std::io::Result<()> {
        injected.fetch_add(1, Ordering::Relaxed);
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{code} (injected by the test proxy)</Message></Error>"
        );
        write!(
            client,
            "HTTP/1.1 {status} {code}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        client.flush()
    };
    match &current {
        Fault::Status { status, code, times, method: only }
            if times.is_none_or(|t| n < t) && only.is_none_or(|m| m == method) =>
        {
            let mut sink = vec![0u8; length.min(64 << 20)];
            reader.read_exact(&mut sink)?;
            return answer(&mut client, *status, code);
        }
        Fault::RefuseKey(key) if header("authorization").is_some_and(|a| a.contains(&format!("Credential={key}/"))) => {
            let mut sink = vec![0u8; length.min(64 << 20)];
            reader.read_exact(&mut sink)?;
            return answer(&mut client, 403, "InvalidAccessKeyId");
        }
        Fault::DropUploads { min_body } if length >= *min_body => {
            let mut half = vec![0u8; length / 2];
            reader.read_exact(&mut half)?;
            injected.fetch_add(1, Ordering::Relaxed);
            return client.shutdown(Shutdown::Both);
        }
        Fault::Delay(d) => std::thread::sleep(*d),
        _ => {}
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut up = TcpStream::connect_timeout(&([127, 0, 0, 1], upstream).into(), Duration::from_secs(5))?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    for line in &head {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:") || lower.starts_with("keep-alive:") {
            continue;
        }
        if line == "\r\n" {
            up.write_all(b"Connection: close\r\n")?;
        }
        up.write_all(line.as_bytes())?;
    }
    up.write_all(&body)?;
    up.flush()?;
    let mut response = Vec::new();
    up.read_to_end(&mut response)?;
    // The response as moto sent it, but closing: the client opens a new connection per request.
    let text_end = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
    let head_text = String::from_utf8_lossy(&response[..text_end]).into_owned();
    let mut out = String::new();
    for line in head_text.split("\r\n") {
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        if line.is_empty() {
            out.push_str("Connection: close\r\n\r\n");
            break;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    client.write_all(out.as_bytes())?;
    client.write_all(&response[text_end..])?;
    client.flush()?;
    client.shutdown(Shutdown::Both)
}
