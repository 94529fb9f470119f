//! A `conductor serve` on a loopback port, and plain HTTP/1.0 exchanges with it (no client
//! library: the tests see the bytes the server sends).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server on a free loopback port, stopped when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with(&super::default_model(), extra)
    }

    pub fn start_with(model: &Path, extra: &[&str]) -> Server {
        let mut child = super::conductor()
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "-t",
                "1",
                "-m",
            ])
            .arg(model)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("conductor serve starts");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|_| {
                panic!(
                    "the server printed no address; its log:\n{}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                )
            });
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Server { child, url, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The log once it holds every one of `lines` (or after 10 s, for the assertion to show).
    /// Startup lines go to stderr before the address goes to stdout, but two threads read the
    /// two pipes, so the address can arrive before the last of the log has been read.
    pub fn log_once_it_has(&self, lines: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let log = self.log();
            if lines.iter().all(|l| log.contains(l)) || started.elapsed() > Duration::from_secs(10)
            {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `conductor run --chat --temp 0` prints for `prompt` (without the final newline).
pub fn run_greedy(model: &Path, flags: &[&str], prompt: &str, n: &str) -> String {
    let run = super::conductor()
        .args([
            "run", "--chat", "--temp", "0", "-t", "1", "-n", n, "-p", prompt, "-m",
        ])
        .arg(model)
        .args(flags)
        .output()
        .expect("conductor run");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let printed = String::from_utf8(run.stdout).expect("UTF-8");
    printed.strip_suffix('\n').unwrap_or(&printed).to_string()
}

/// One greedy chat request of `max_tokens` over a fresh HTTP/1.0 connection (the body ends
/// when the server closes it); the answer's text, gathered from the events when `stream`.
pub fn chat(server: &Server, prompt: &str, max_tokens: u32, stream: bool) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a header");
    assert!(head.contains(" 200 "), "{head}\n{body}");
    if !stream {
        let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        return v["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_string();
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<serde_json::Value>(d).expect("a JSON event"))
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// `GET path` over a fresh connection; the body.
pub fn get(server: &Server, path: &str) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    write!(conn, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("read");
    reply
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_string())
}

pub fn metric(server: &Server, name: &str) -> f64 {
    get(server, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics"))
}

/// One HTTP/1.0 exchange over a fresh connection: the status code, the headers (names in lower
/// case) and the body.
pub fn exchange(
    server: &Server,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("a read timeout");
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        conn,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("a header");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}
