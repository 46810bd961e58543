//! What the demo prints: facts as they happen, each stamped with the time since the start, and
//! a live progress line (rewritten in place on a terminal; a plain line every few seconds when
//! stdout is a pipe or a file, as in CI).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counters the progress line shows, updated by the actors as they go.
#[derive(Default)]
pub struct Progress {
    /// Pings sent by the pool users (first sends).
    pub pings: AtomicU64,
    /// Pings answered.
    pub answered: AtomicU64,
    /// Failovers completed.
    pub failovers: AtomicU64,
    /// Gateway sessions ended.
    pub gateway_sessions: AtomicU64,
    /// Gateway sessions whose member was lost.
    pub gateway_lost: AtomicU64,
    /// PEs still running.
    pub pes_alive: AtomicU64,
    /// Registrars still running.
    pub registrars_alive: AtomicU64,
}

/// The printer shared by every part of the demo.
#[derive(Clone)]
pub struct Out {
    start: Instant,
    tty: bool,
    /// Whether a progress line is on the screen now (terminal only).
    shown: Arc<Mutex<bool>>,
    /// The counters behind the progress line.
    pub progress: Arc<Progress>,
}

impl Out {
    /// A printer whose clock starts now.
    pub fn new() -> Out {
        Out {
            start: Instant::now(),
            tty: std::io::stdout().is_terminal(),
            shown: Arc::new(Mutex::new(false)),
            progress: Arc::new(Progress::default()),
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// One fact, stamped with the time since the start.
    pub fn fact(&self, text: impl AsRef<str>) {
        let t = self.start.elapsed().as_secs_f64();
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if *shown {
            print_raw("\r\x1b[2K");
            *shown = false;
        }
        for (i, line) in text.as_ref().lines().enumerate() {
            if i == 0 {
                outln!("[{t:6.2}s] {line}");
            } else {
                outln!("          {line}");
            }
        }
    }

    /// A line without a time stamp (headings, the summary).
    pub fn line(&self, text: impl AsRef<str>) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if *shown {
            print_raw("\r\x1b[2K");
            *shown = false;
        }
        outln!("{}", text.as_ref());
    }

    fn progress_text(&self, phase: &str) -> String {
        let p = &self.progress;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{phase} | registrars {} | PEs {} | Pings {} sent, {} answered | failovers {} | gateway sessions {} ended, {} lost their member",
            g(&p.registrars_alive),
            g(&p.pes_alive),
            g(&p.pings),
            g(&p.answered),
            g(&p.failovers),
            g(&p.gateway_sessions),
            g(&p.gateway_lost),
        )
    }

    /// Runs the progress display until `stop` resolves: on a terminal one line rewritten five
    /// times a second, otherwise a plain line every 3 s.
    pub async fn run_progress(self, phase: tokio::sync::watch::Receiver<String>) {
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(3)
        };
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let text = self.progress_text(&phase.borrow());
            if self.tty {
                let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
                let t = self.start.elapsed().as_secs_f64();
                // One screen line, or the next rewrite would leave the wrapped part behind.
                let width = ratatui::crossterm::terminal::size()
                    .map(|(w, _)| usize::from(w))
                    .unwrap_or(80);
                let line: String = format!("[{t:6.2}s] {text}")
                    .chars()
                    .take(width.saturating_sub(1).max(1))
                    .collect();
                print_raw(&format!("\r\x1b[2K{line}"));
                *shown = true;
            } else {
                self.fact(format!("progress: {text}"));
            }
        }
    }

    /// Clears the progress line (terminal) before the summary.
    pub fn clear(&self) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if *shown {
            print_raw("\r\x1b[2K");
            *shown = false;
        }
    }
}

fn print_raw(s: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(s.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        // A closed pipe: end quietly, as outln! does.
        std::process::exit(0);
    }
}
