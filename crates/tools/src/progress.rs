//! Progress of a long step on stderr: an `indicatif` bar when stderr is a terminal, plain
//! lines (`tool: what: done/total`, about one a second) otherwise, so that logs and pipes
//! get what they always got. Nothing is shown during a step's first second.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Nothing is shown before a step has run this long.
const QUIET_START: Duration = Duration::from_secs(1);
/// Plain lines: one per this long.
const LINE_EVERY: Duration = Duration::from_secs(1);
/// The bar: updated at most this often (the caller may tick on every iteration).
const BAR_EVERY: Duration = Duration::from_millis(100);

/// How a plain line ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// `label: 12/100` (cmtime).
    OfTotal,
    /// `label: 12 iterations` (rdma-perf).
    Iterations,
}

/// The progress of one step; the bar, if any, is cleared when it is dropped.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: Option<u64>,
    line: Line,
    tty: bool,
    next: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A step called `label` (e.g. `cmtime: connect`) that will reach `total`, if known.
    pub fn new(label: impl Into<String>, total: Option<u64>, line: Line) -> Progress {
        Progress::with_tty(label, total, line, std::io::stderr().is_terminal())
    }

    fn with_tty(label: impl Into<String>, total: Option<u64>, line: Line, tty: bool) -> Progress {
        Progress {
            label: label.into(),
            total,
            line,
            tty,
            next: Instant::now() + QUIET_START,
            bar: None,
        }
    }

    /// `done` so far, at `now`. Cheap when there is nothing to show (one comparison).
    pub fn tick(&mut self, now: Instant, done: u64) {
        if now < self.next {
            return;
        }
        if self.tty {
            self.bar
                .get_or_insert_with(|| bar(&self.label, self.total))
                .set_position(done);
            self.next = now + BAR_EVERY;
        } else {
            eprintln!("{}", self.plain_line(done));
            self.next = now + LINE_EVERY;
        }
    }

    /// The plain line for `done`.
    fn plain_line(&self, done: u64) -> String {
        match (self.line, self.total) {
            (Line::OfTotal, Some(t)) => format!("{}: {done}/{t}", self.label),
            (Line::OfTotal, None) => format!("{}: {done}", self.label),
            (Line::Iterations, _) => format!("{}: {done} iterations", self.label),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

fn bar(label: &str, total: Option<u64>) -> ProgressBar {
    let (b, template) = match total {
        Some(t) => (
            ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
            "{prefix}: [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)",
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            "{prefix}: {spinner} {pos} ({elapsed})",
        ),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        b.set_style(style.progress_chars("=> "));
    }
    b.set_prefix(label.to_string());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_as_before() {
        let p = Progress::with_tty("cmtime: connect", Some(100), Line::OfTotal, false);
        assert_eq!(p.plain_line(12), "cmtime: connect: 12/100");
        let p = Progress::with_tty("rdma-perf: send_lat 2 B", Some(9), Line::Iterations, false);
        assert_eq!(p.plain_line(3), "rdma-perf: send_lat 2 B: 3 iterations");
    }

    #[test]
    fn quiet_first_second_then_bar_on_a_tty() {
        let mut p = Progress::with_tty("x", Some(10), Line::OfTotal, true);
        let t0 = Instant::now();
        p.tick(t0, 1);
        assert!(p.bar.is_none());
        p.tick(t0 + Duration::from_secs(2), 5);
        assert_eq!(p.bar.as_ref().map(|b| b.position()), Some(5));
        // Rate-limited: a tick right after does not move it.
        p.tick(t0 + Duration::from_secs(2), 6);
        assert_eq!(p.bar.as_ref().map(|b| b.position()), Some(5));
        p.tick(t0 + Duration::from_secs(3), 7);
        assert_eq!(p.bar.as_ref().map(|b| b.position()), Some(7));
    }
}
