//! Where program threads run, so that a fault is served on the faulting thread's own CPU.
//!
//! The kernel publishes each thread's current CPU in the thread's rseq area, which glibc
//! (2.35 and later) registers for every thread at `thread pointer + __rseq_offset`. A thread
//! that calls [`register_current_thread`] enters its thread id and the address of that word
//! in a small lock-free table; a fault thread that reads a fault of a registered thread then
//! knows the CPU the thread faulted on (a thread asleep in a fault does not move) and hands
//! the fault to the fault thread pinned there. Waking a thread on its own CPU costs no
//! inter-processor interrupt, which on a virtual machine is most of a fault's overhead.
//!
//! Without glibc's rseq (older glibc, `glibc.pthread.rseq=0`, other architectures) nothing is
//! registered and faults are served by whichever fault thread reads them.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Release};
use std::sync::OnceLock;

/// Table size and the probe window of one thread id.
const SLOTS: usize = 4096;
const PROBE: usize = 64;

struct Slot {
    tid: AtomicU32,
    /// Address of the thread's rseq `cpu_id` word; 0 while the slot is being filled or
    /// emptied.
    cpu_word: AtomicUsize,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        tid: AtomicU32::new(0),
        cpu_word: AtomicUsize::new(0),
    }
}; SLOTS];

/// Offset of glibc's rseq area from the thread pointer; None without one.
fn rseq_offset() -> Option<isize> {
    static OFF: OnceLock<Option<isize>> = OnceLock::new();
    *OFF.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; the results are only read when glibc
        // exports the symbols (it defines them as `ptrdiff_t` and `unsigned int`).
        unsafe {
            let off = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
            if off.is_null() || size.is_null() || *(size as *const u32) == 0 {
                return None;
            }
            Some(*(off as *const isize))
        }
    })
}

fn thread_pointer() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: on x86-64 glibc keeps the thread control block's own address in its first
        // word, at %fs:0; reading it has no side effect.
        unsafe {
            std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
        };
        Some(tp)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: reads the thread pointer register; no side effect.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags))
        };
        Some(tp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// First slot of `tid`'s probe window.
fn home(tid: u32) -> usize {
    (tid as usize).wrapping_mul(0x9e37_79b9) % SLOTS
}

fn cpu_at(word: usize) -> u32 {
    // SAFETY: `word` is the rseq `cpu_id` field of the calling thread (while it registers)
    // or of a registered thread (4-byte aligned, in its thread control block). A thread leaves the table (thread-local destructor) before
    // glibc frees its control block, and the pager reads the word only while handling a
    // fault of that thread, which is asleep in the fault. (A thread could leave the fault
    // through a signal handler and exit within the microsecond between the pager reading the
    // fault and this load; glibc keeps the stacks of exited threads cached, so the load would
    // then read a stale CPU number, used only as a hint.) The kernel writes the word, hence
    // the atomic load.
    unsafe { (*(word as *const AtomicU32)).load(Acquire) }
}

struct Registration {
    slot: Cell<Option<usize>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot.take() {
            TABLE[i].cpu_word.store(0, Release);
            TABLE[i].tid.store(0, Release);
        }
    }
}

thread_local! {
    static REGISTERED: Registration = const { Registration { slot: Cell::new(None) } };
}

/// Enters the calling thread in the table (once; it leaves at thread exit). Returns whether
/// the thread is registered: false without glibc's rseq area, or when the table is full.
pub fn register_current_thread() -> bool {
    REGISTERED
        .try_with(|r| {
            if r.slot.get().is_some() {
                return true;
            }
            let (Some(off), Some(tp)) = (rseq_offset(), thread_pointer()) else {
                return false;
            };
            // struct rseq { u32 cpu_id_start; u32 cpu_id; ... }
            let word = tp.wrapping_add_signed(off) + 4;
            // The computed word must hold the CPU we run on: checks the layout assumptions
            // before anyone relies on them (a few tries: the thread may move in between).
            if word % 4 != 0 {
                return false;
            }
            let matches = (0..4).any(|_| {
                // SAFETY: sched_getcpu has no preconditions.
                let now = unsafe { libc::sched_getcpu() };
                now >= 0 && cpu_at(word) == now as u32
            });
            if !matches {
                return false;
            }
            let tid = gettid();
            let h = home(tid);
            for k in 0..PROBE {
                let i = (h + k) % SLOTS;
                if TABLE[i]
                    .tid
                    .compare_exchange(0, tid, Acquire, Acquire)
                    .is_ok()
                {
                    TABLE[i].cpu_word.store(word, Release);
                    r.slot.set(Some(i));
                    return true;
                }
            }
            false
        })
        .unwrap_or(false)
}

/// The CPU a registered thread last ran on (where it faulted, when it waits in a fault).
pub(crate) fn cpu_of(tid: u32) -> Option<usize> {
    if tid == 0 {
        return None;
    }
    let h = home(tid);
    for k in 0..PROBE {
        let s = &TABLE[(h + k) % SLOTS];
        if s.tid.load(Acquire) == tid {
            let word = s.cpu_word.load(Acquire);
            if word == 0 {
                return None;
            }
            let cpu = cpu_at(word);
            // Unregistered (-1) or failed registration (-2) read as huge values.
            return (cpu < libc::CPU_SETSIZE as u32).then_some(cpu as usize);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_thread_is_found_on_its_cpu_and_leaves_at_exit() {
        let tid = std::thread::spawn(|| {
            let tid = gettid();
            if !register_current_thread() {
                // No rseq area here (old glibc): nothing to check.
                return (tid, None);
            }
            assert!(register_current_thread(), "registering twice is harmless");
            // SAFETY: no preconditions.
            let now = unsafe { libc::sched_getcpu() } as usize;
            let seen = cpu_of(tid);
            (tid, Some((now, seen)))
        })
        .join()
        .unwrap();
        let (tid, seen) = tid;
        if let Some((now, seen)) = seen {
            // The thread may have moved between the two reads; on one CPU it cannot.
            assert!(seen.is_some());
            if std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                == 1
            {
                assert_eq!(seen, Some(now));
            }
            assert_eq!(cpu_of(tid), None, "the thread left the table at exit");
        }
    }
}
