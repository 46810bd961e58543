//! A child process of a test whose stdout and stderr are collected as they come, with waits that
//! poll for a condition against a generous deadline and panic with both outputs.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any wait of a test may take (the machine may be loaded).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A child process whose stdout and stderr are collected as they come.
pub struct Proc {
    pub child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
}

/// Collects whole lines only, so that a waiter never sees half a line (stderr is unbuffered:
/// one line may come in several writes).
fn collect(r: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => into
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&line)),
            }
        }
    });
}

impl Proc {
    /// Starts `program` with `args`, writing `stdin` to it when given (else stdin is empty).
    pub fn spawn(program: &str, args: &[&str], stdin: Option<&str>) -> Proc {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program} runs: {e}"));
        if let Some(text) = stdin {
            let mut w = child.stdin.take().unwrap();
            let text = text.to_string();
            std::thread::spawn(move || {
                let _ = w.write_all(text.as_bytes());
            });
        }
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        collect(child.stdout.take().unwrap(), out.clone());
        collect(child.stderr.take().unwrap(), err.clone());
        Proc { child, out, err }
    }

    /// Starts `rserpool` with `args`.
    pub fn start(args: &[&str], stdin: Option<&str>) -> Proc {
        Self::spawn(env!("CARGO_BIN_EXE_rserpool"), args, stdin)
    }

    /// What it printed on stdout so far.
    pub fn out(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// What it printed on stderr so far.
    pub fn err(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    /// Waits until stdout or stderr holds `what`; panics with both after the deadline.
    pub fn wait_for(&self, what: &str) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            let (o, e) = (self.out(), self.err());
            if o.contains(what) || e.contains(what) {
                return o + &e;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what:?}\nstdout:\n{o}\nstderr:\n{e}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the exit and says whether it succeeded; panics after the deadline.
    pub fn wait_exit(&mut self) -> bool {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the readers drain.
                std::thread::sleep(Duration::from_millis(100));
                return s.success();
            }
            assert!(
                Instant::now() < end,
                "did not exit\nstdout:\n{}\nstderr:\n{}",
                self.out(),
                self.err()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal, e.g. "-TERM", "-STOP"; panics when `kill` fails.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The word after `prefix` in `text` (up to white space, ',', ']' or ')'); panics when absent.
pub fn word_after(text: &str, prefix: &str) -> String {
    let i = text
        .find(prefix)
        .unwrap_or_else(|| panic!("{prefix:?} not in:\n{text}"));
    text[i + prefix.len()..]
        .split(|c: char| c.is_whitespace() || c == ',' || c == ']' || c == ')')
        .next()
        .unwrap()
        .to_string()
}

/// `rserpool pe` over the TCP mapping on 127.0.0.1 with metrics, registered at `registrar`;
/// the process and the PE's identifier.
pub fn start_pe(registrar: &str, extra: &[&str]) -> (Proc, String) {
    let mut args = vec![
        "pe",
        "--registrar",
        registrar,
        "--transport",
        "tcp",
        "--local",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let p = Proc::start(&args, None);
    let text = p.wait_for(" registered\n");
    let id = word_after(&text, "PE ");
    (p, id)
}

/// The `ADDR:PORT` of the HTTP endpoint a daemon announced ("metrics at http://ADDR:PORT/metrics").
pub fn endpoint_of(p: &Proc) -> String {
    word_after(&p.wait_for("metrics at http://"), "metrics at http://")
        .trim_end_matches("/metrics")
        .to_string()
}

/// `rserpool pu --service pingpong` over the TCP mapping with its HTTP endpoint on a free port,
/// quiet; `extra` arguments are appended. The process and its endpoint.
pub fn start_pu(registrar: &str, extra: &[&str]) -> (Proc, String) {
    let mut args = vec![
        "pu",
        "--registrar",
        registrar,
        "--transport",
        "tcp",
        "--service",
        "pingpong",
        "--quiet",
        "true",
        "--metrics",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let p = Proc::start(&args, None);
    let endpoint = endpoint_of(&p);
    (p, endpoint)
}

/// `rserpool lsnat` on 127.0.0.1 with one static member nobody listens on (port 9) and its HTTP
/// endpoint on a free port: the process, its endpoint, and the directory of its configuration
/// (keep it as long as the process).
pub fn start_gateway() -> (Proc, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lsnat.toml");
    std::fs::write(
        &config,
        "metrics = \"127.0.0.1:0\"\n[[listener]]\naddress = \"127.0.0.1:0\"\nprotocol = \"tcp\"\n\
         [pool]\npolicy = \"round-robin\"\nmembers = [ { address = \"127.0.0.1:9\", weight = 1 } ]\n",
    )
    .unwrap();
    let p = Proc::start(&["lsnat", "-c", config.to_str().unwrap()], None);
    let endpoint = endpoint_of(&p);
    (p, endpoint, dir)
}

/// `rserpool registrar` over the TCP mapping on 127.0.0.1 with a free port and announces off;
/// `extra` arguments are appended. The process and its ASAP address (`ADDR:PORT`).
pub fn start_registrar(extra: &[&str]) -> (Proc, String) {
    let mut args = vec![
        "registrar",
        "--transport",
        "tcp",
        "--asap",
        "127.0.0.1:0",
        "--asap-announce",
        "off",
    ];
    args.extend_from_slice(extra);
    let r = Proc::start(&args, None);
    let text = r.wait_for("serving ASAP over TCP on ");
    let asap = word_after(&text, "serving ASAP over TCP on ");
    (r, asap)
}

/// Runs `rserpool` with `args` to its end: whether it succeeded, its stdout and its stderr.
pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
