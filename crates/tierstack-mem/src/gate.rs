//! A gate that work passes through and that `fork` closes: closing waits until no one is
//! inside, and keeps newcomers waiting until it opens again. Made of two atomics (no lock a
//! forked child could inherit held): a child resets it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// The gate (see the module).
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
    inside: AtomicUsize,
}

/// Being inside a [`Gate`]; leaving on drop.
pub struct Inside<'a>(&'a Gate);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, SeqCst);
    }
}

impl Gate {
    /// An open gate.
    pub const fn new() -> Gate {
        Gate {
            closed: AtomicBool::new(false),
            inside: AtomicUsize::new(0),
        }
    }

    /// Enters, waiting while the gate is closed.
    pub fn enter(&self) -> Inside<'_> {
        loop {
            self.inside.fetch_add(1, SeqCst);
            if !self.closed.load(SeqCst) {
                return Inside(self);
            }
            self.inside.fetch_sub(1, SeqCst);
            while self.closed.load(SeqCst) {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Closes the gate and waits until everyone inside has left. The caller must not be
    /// inside itself.
    pub fn close(&self) {
        self.closed.store(true, SeqCst);
        while self.inside.load(SeqCst) > 0 {
            std::thread::yield_now();
        }
    }

    /// Opens the gate again.
    pub fn open(&self) {
        self.closed.store(false, SeqCst);
    }

    /// In a child made by `fork`: only the forking thread exists, and it is not inside.
    pub fn reset(&self) {
        self.inside.store(0, SeqCst);
        self.closed.store(false, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_those_inside_and_holds_newcomers() {
        let g = Arc::new(Gate::new());
        let work = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (g, work, stop) = (g.clone(), work.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        let _in = g.enter();
                        work.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        g.close();
        let frozen = work.load(SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(work.load(SeqCst), frozen, "nobody works while closed");
        g.open();
        std::thread::sleep(Duration::from_millis(20));
        assert!(work.load(SeqCst) > frozen);
        stop.store(true, SeqCst);
        for t in threads {
            t.join().expect("join");
        }
    }
}
