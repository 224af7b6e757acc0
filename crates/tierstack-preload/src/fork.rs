//! `fork` under `tierstack run`: before it the shim's region work and the pager's threads stop
//! between units of work and the store is written out; the child takes the regions over with
//! a pager and an array of its own over a read-only view of the parent's (see
//! [`fork_prepare`] and [`fork_in_child`]).

use super::*;

/// Descriptors of the hold made for the fork under way (see [`fork_prepare`]); -1: none.
pub(crate) static HOLD_CHILD: AtomicI32 = AtomicI32::new(-1);
pub(crate) static HOLD_PARENT: AtomicI32 = AtomicI32::new(-1);
/// The engine was quiesced and flushed for the fork under way.
pub(crate) static FORK_READY: AtomicBool = AtomicBool::new(false);

/// Before `fork`: the shim's region work and the pager's threads stop between units of
/// work, the store's write buffer is written to the array and the array's open stripe sealed
/// (so what the drives' files hold is every page not resident; not synced: the child reads
/// the same files), and a hold is made: a file with a shared `flock` on one open file
/// description (the child keeps it, and its own children inherit it) and a second open file
/// description the parent gives the array, whose cleaner then frees no segment until every
/// holder is gone. The child reads the parent's pages from a read-only view of the array
/// made after this point; the parent only appends meanwhile.
pub(crate) extern "C" fn fork_prepare() {
    FORK_READY.store(false, SeqCst);
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    GATE.close();
    let _b = Busy::outside();
    let Some(e) = ENGINE.lock().clone() else {
        return;
    };
    e.pager.pause();
    // The child reads the same files: what they hold must be complete, not durable.
    let settled = e
        .pager
        .store()
        .settle()
        .map_err(PreloadError::from)
        .and_then(|_| e.array.settle().map_err(PreloadError::from));
    if let Err(err) = settled {
        eprintln!("tierstack: fork: cannot write the paging store out ({err}); the child will not be able to read paged memory");
        return;
    }
    match make_hold() {
        Ok((child, parent)) => {
            HOLD_CHILD.store(child, SeqCst);
            HOLD_PARENT.store(parent, SeqCst);
            FORK_READY.store(true, SeqCst);
        }
        Err(err) => {
            eprintln!("tierstack: fork: {err}; the child will not be able to read paged memory")
        }
    }
}

/// A memfd with a shared lock on its first open file description, and a second one.
pub(crate) fn make_hold() -> Result<(c_int, c_int), PreloadError> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; flock and open take the
    // descriptors and the path made here.
    unsafe {
        let a = libc::memfd_create(c"tierstack-fork-hold".as_ptr(), libc::MFD_CLOEXEC);
        if a < 0 {
            return Err(PreloadError::Os {
                what: "memfd_create",
                source: std::io::Error::last_os_error(),
            });
        }
        if libc::flock(a, libc::LOCK_SH) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(a);
            return Err(PreloadError::Os {
                what: "flock",
                source: e,
            });
        }
        let path = format!("/proc/self/fd/{a}\0");
        let b = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if b < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(a);
            return Err(PreloadError::Os {
                what: "cannot reopen the hold through /proc",
                source: e,
            });
        }
        Ok((a, b))
    }
}

/// After `fork`, in the parent: the array keeps the child's segments; work resumes.
pub(crate) extern "C" fn fork_in_parent() {
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    let _b = Busy::outside();
    if let Some(e) = ENGINE.lock().clone() {
        let (child, parent) = (HOLD_CHILD.swap(-1, SeqCst), HOLD_PARENT.swap(-1, SeqCst));
        if parent >= 0 {
            use std::os::fd::FromRawFd;
            // SAFETY: `parent` was opened by make_hold for this fork and is owned here.
            e.array
                .hold_segments(unsafe { std::os::fd::OwnedFd::from_raw_fd(parent) });
        }
        if child >= 0 {
            // SAFETY: the child's copy keeps the lock; the parent's descriptor goes.
            unsafe { libc::close(child) };
        }
        e.pager.resume();
    }
    GATE.open();
}

/// After `fork`, in the child: it takes over the parent's regions with a pager of its own.
/// Pages resident at the fork were copied by the kernel; the others are read from a
/// read-only view of the parent's array (kept in place by the hold); what the child writes
/// goes to an array of its own. It gets the same budget (`--dram`) as the parent. Where that
/// cannot be set up, its regions become inaccessible (a touch is a SIGSEGV with a message),
/// never silently zero.
pub(crate) extern "C" fn fork_in_child() {
    GATE.reset();
    if STATE.load(SeqCst) != RUNNING || FORKED.load(SeqCst) {
        return;
    }
    let _b = Busy::outside();
    let parent = HOLD_PARENT.swap(-1, SeqCst);
    if parent >= 0 {
        // SAFETY: the parent's end of the hold is not the child's to keep.
        unsafe { libc::close(parent) };
    }
    // The child's end (shared lock) stays open for the child's life (close-on-exec).
    HOLD_CHILD.store(-1, SeqCst);
    // The parent's engine: its threads do not exist here and its store is the parent's.
    let old = ENGINE.lock().take();
    let Some(old) = old else { return };
    let result = if FORK_READY.load(SeqCst) {
        take_over(&old)
    } else {
        Err(PreloadError::NotPrepared)
    };
    match result {
        Ok(engine) => {
            *ENGINE.lock() = Some(Arc::new(engine));
            tierstack_mem::register_current_thread();
        }
        Err(msg) => {
            eprintln!("tierstack: forked child: cannot take over paged memory ({msg}); it is not accessible in this process");
            fence_regions();
            FORKED.store(true, SeqCst);
            STATE.store(OFF, SeqCst);
        }
    }
    // Never dropped: dropping would unmap the regions and write to the parent's store. The
    // copy of its compressed pages (all in the parent's array: the store was settled before
    // the fork) is given back, so that it does not count against this child's budget.
    old.pager.store().release_memory();
    std::mem::forget(old);
}

pub(crate) fn take_over(old: &Arc<Engine>) -> Result<Engine, PreloadError> {
    let view = old
        .array
        .read_only_view()
        .map_err(PreloadError::ParentArray)?;
    let mut snapshots = vec![Arc::new(view)];
    snapshots.extend(old.snapshots.iter().cloned());
    let array = own_array(&old.dir, old.page, old.dram)?;
    let engine = build_engine(
        Arc::new(array),
        snapshots,
        old.dram,
        old.page,
        old.dir.clone(),
        Tiers {
            vram: None,
            ..shim_tiers()?
        },
    )?;
    {
        let olds = old.regions.lock();
        let mut news = engine.regions.lock();
        for (&base, r) in olds.iter() {
            let n = engine.pager.adopt(r)?;
            news.insert(base, n);
        }
    }
    Ok(engine)
}

/// Makes every region inaccessible in a forked child that cannot page them: a touch is a
/// SIGSEGV that says why, never a silent zero.
pub(crate) fn fence_regions() {
    let high = HIGH.load(Acquire);
    for i in 0..high {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        if b == 0 || b == usize::MAX {
            continue;
        }
        // SAFETY: replaces the region's range (ours, registered with the parent's userfaultfd
        // in the parent only) with an inaccessible mapping.
        unsafe {
            libc::syscall(
                libc::SYS_mmap,
                b,
                l,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }
    // SAFETY: installing a handler for SIGSEGV with a zeroed, then filled, sigaction; the
    // handler only reads atomics and calls async-signal-safe functions.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old);
        // Only where the program has no handler of its own (it inherits that one).
        if old.sa_sigaction == libc::SIG_DFL {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forked_segv as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
    }
}
