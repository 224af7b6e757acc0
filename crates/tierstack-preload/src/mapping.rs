//! Anonymous private `mmap`, `munmap`, `mremap`, `madvise` and the `mlock` family: large
//! mappings and reservations become regions; calls on a region's range are served by the
//! pager.

use super::*;

pub(crate) fn anonymous_private(addr: *mut c_void, prot: c_int, flags: c_int, fd: c_int) -> bool {
    let odd = libc::MAP_SHARED
        | libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK;
    addr.is_null()
        && fd == -1
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & odd == 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
}

/// # Safety
/// C `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mmap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if anonymous_private(addr, prot, flags, fd) && wants_region(len) {
            match new_region(len, 4096, 0) {
                Got::Region(p) => return p,
                Got::NoMemory => {
                    set_errno(libc::ENOMEM);
                    return libc::MAP_FAILED;
                }
                Got::Fallback => {}
            }
        }
        // A reservation (address space the JVM, V8 and other runtimes take inaccessible, then
        // commit piece by piece): a region, inaccessible until parts of it are committed. One
        // the store cannot back stays the kernel's.
        if reservation(prot, flags, fd) && wants_region(len) {
            if let Got::Region(p) = new_region(len, 4096, addr as usize) {
                if let Some(rlen) = region_len(p as usize) {
                    libc::syscall(libc::SYS_mprotect, p, rlen, libc::PROT_NONE);
                }
                return p;
            }
        }
        if flags & libc::MAP_FIXED != 0 && !FORKED.load(Relaxed) {
            if let Some((base, off, olen)) = overlap(addr as usize, len) {
                // A fresh anonymous private mapping inside a region (a runtime commits or
                // uncommits part of its reservation): the range reads as zeros, gets the new
                // protection, and stays paged.
                if olen == len && fresh_anonymous(flags, fd) {
                    commit(addr as usize, base, off, len, prot);
                    return addr;
                }
                // Anything else over part of a region replaces those pages: they stop being
                // the region's (never evicted, never read back) before the kernel maps it.
                let _b = Busy::enter();
                if let Some(e) = ENGINE.lock().clone() {
                    if let Some(r) = e.regions.lock().get(&base) {
                        r.forget(off, olen);
                    }
                }
            }
        }
        libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
    }
}

/// `mmap` flags of a reservation: private anonymous, inaccessible, not fixed (an address is
/// a hint).
pub(crate) fn reservation(prot: c_int, flags: c_int, fd: c_int) -> bool {
    prot == libc::PROT_NONE && flags & libc::MAP_FIXED == 0 && fresh_anonymous(flags, fd)
}

/// `mmap` flags of a private anonymous mapping with nothing special about it.
pub(crate) fn fresh_anonymous(flags: c_int, fd: c_int) -> bool {
    let odd = libc::MAP_SHARED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK;
    fd == -1
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & odd == 0
}

/// `[a, a+len)` (offset `off` of region `base`) becomes a fresh mapping with protection
/// `prot`: zeros, paged as before.
///
/// # Safety
/// The range must lie in the live region `base`.
pub(crate) unsafe fn commit(a: usize, base: usize, off: usize, len: usize, prot: c_int) {
    // SAFETY: the caller upholds this function's `# Safety` contract; the range is ours.
    unsafe {
        zero_range(base, off, len);
        libc::syscall(libc::SYS_mprotect, a, len, prot);
    }
}

/// The part of `[a, a+len)` that lies in a region: (region base, offset, length).
pub(crate) fn overlap(a: usize, len: usize) -> Option<(usize, usize, usize)> {
    let high = HIGH.load(Acquire);
    (0..high).find_map(|i| {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        if b == 0 || b == usize::MAX {
            return None;
        }
        let lo = a.max(b);
        let hi = a.saturating_add(len).min(b + l);
        (lo < hi).then_some((b, lo - b, hi - lo))
    })
}

/// Makes `[off, off+len)` of region `base` read as zeros and leave the store, as
/// `MADV_DONTNEED` does natively: whole tierstack pages are discarded, the bytes of pages only
/// partly in the range are zeroed in place.
///
/// # Safety
/// The range must lie in the live region `base`.
pub(crate) unsafe fn zero_range(base: usize, off: usize, len: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract, which covers
    // every call and pointer access below.
    unsafe {
        let _b = Busy::enter();
        let Some(e) = ENGINE.lock().clone() else {
            return;
        };
        let page = e.pager.page();
        let first = off.div_ceil(page) * page;
        let end = ((off + len) / page) * page;
        let regions = e.regions.lock();
        let Some(r) = regions.get(&base) else { return };
        // SAFETY (caller): every byte range below lies inside the region's mapping; a page that
        // is not resident is changed in the store, a resident one in place.
        let part = |o: usize, n: usize| {
            if n > 0 && !r.zero_part(o, n) {
                zero_bytes(base + o, n);
            }
        };
        if first < end {
            r.discard(first, end - first);
            part(off, first - off);
            part(end, off + len - end);
        } else {
            // Within one page: its bytes are zeroed.
            part(off, len);
        }
    }
}

/// Writes zeros over `[a, a+len)` of our own memory directly (where the pager could not).
///
/// # Safety
/// The range must lie in a live region the program may write.
pub(crate) unsafe fn zero_bytes(a: usize, len: usize) {
    // SAFETY: the caller's range lies in a live region the program may write.
    unsafe { std::ptr::write_bytes(a as *mut u8, 0, len) }
}

/// # Safety
/// C `madvise`. On a region, `MADV_DONTNEED`, `MADV_FREE` and `MADV_REMOVE` make the range read
/// as zeros (and leave the store); advice that would change how the kernel pages it
/// (huge pages, merging, fork inheritance, ...) is accepted and ignored, since tierstack pages
/// the region; anything else goes to the kernel.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // SAFETY: the program calls this as C `madvise`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = addr as usize;
        if !FORKED.load(Relaxed) {
            if let Some((base, off, olen)) = overlap(a, len) {
                match advice {
                    libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => {
                        zero_range(base, off, olen);
                        // The part outside the region (if any) is the kernel's.
                        if off == 0 && a < base {
                            libc::syscall(libc::SYS_madvise, addr, base - a, advice);
                        }
                        return 0;
                    }
                    libc::MADV_NORMAL
                    | libc::MADV_RANDOM
                    | libc::MADV_SEQUENTIAL
                    | libc::MADV_WILLNEED
                    | libc::MADV_HUGEPAGE
                    | libc::MADV_NOHUGEPAGE
                    | libc::MADV_MERGEABLE
                    | libc::MADV_UNMERGEABLE
                    | libc::MADV_DONTFORK
                    | libc::MADV_DOFORK
                    | libc::MADV_DONTDUMP
                    | libc::MADV_DODUMP
                    | libc::MADV_COLD
                    | libc::MADV_PAGEOUT => return 0,
                    _ => {}
                }
            }
        }
        libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int
    }
}

/// # Safety
/// C `mmap64` (the same as `mmap` on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mmap64`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// Applies `lock` (a memory-locking system call on a range) to the parts of `[a, a+len)`
/// outside the region it overlaps: the pager decides what of a region is resident (locking
/// would fault all of it in past the budget, and locked pages could not be released).
pub(crate) fn lock_outside_regions(
    a: usize,
    len: usize,
    lock: impl Fn(usize, usize) -> c_int,
) -> c_int {
    if FORKED.load(Relaxed) {
        return lock(a, len);
    }
    let Some((base, off, olen)) = overlap(a, len) else {
        return lock(a, len);
    };
    let (lo, hi) = (base + off, base + off + olen);
    let mut rc = 0;
    if a < lo {
        rc |= lock(a, lo - a);
    }
    if hi < a + len {
        rc |= lock(hi, a + len - hi);
    }
    rc
}

/// # Safety
/// C `mlock`: on a region, accepted and left to the pager (see [`lock_outside_regions`]).
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: size_t) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: mlock of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_mlock, a, n) as c_int }
    })
}

/// # Safety
/// C `mlock2`: as [`mlock`].
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: size_t, flags: libc::c_uint) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: mlock2 of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_mlock2, a, n, flags) as c_int }
    })
}

/// # Safety
/// C `munlock`.
#[no_mangle]
pub unsafe extern "C" fn munlock(addr: *const c_void, len: size_t) -> c_int {
    lock_outside_regions(addr as usize, len, |a, n| {
        // SAFETY: munlock of a range of the program's choosing, as it asked.
        unsafe { libc::syscall(libc::SYS_munlock, a, n) as c_int }
    })
}

/// # Safety
/// C `mlockall`. Pages are locked as they are faulted in (`MCL_ONFAULT` is added: locking
/// everything at once would fault every region in past the budget), and regions, present and
/// future, are left to the pager.
#[no_mangle]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    // SAFETY: mlockall with the program's flags plus MCL_ONFAULT; then munlock of our regions.
    unsafe {
        let onfault = if THRESHOLD.load(Relaxed) != 0 && !FORKED.load(Relaxed) {
            libc::MCL_ONFAULT
        } else {
            0
        };
        let rc = libc::syscall(libc::SYS_mlockall, flags | onfault) as c_int;
        if rc == 0 && onfault != 0 {
            let high = HIGH.load(Acquire);
            for i in 0..high {
                let b = BASES[i].load(Acquire);
                let l = LENS[i].load(Acquire);
                if b != 0 && b != usize::MAX {
                    libc::syscall(libc::SYS_munlock, b, l);
                }
            }
        }
        rc
    }
}

/// # Safety
/// C `munmap`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: the program calls this as C `munmap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = addr as usize;
        if let Some((_, base, rlen)) = slot_containing(a) {
            if FORKED.load(Relaxed) {
                return 0;
            }
            if a == base && len >= rlen {
                free_region(a);
            } else {
                // Part of a region: its pages are released, the range stays reserved until the
                // whole region is unmapped.
                let _b = Busy::enter();
                if let Some(e) = ENGINE.lock().clone() {
                    if let Some(r) = e.regions.lock().get(&base) {
                        r.discard(a - base, len);
                    }
                }
                // A touch there faults, as natively.
                let len = len.min(base + rlen - a);
                libc::syscall(libc::SYS_mprotect, a, len, libc::PROT_NONE);
            }
            return 0;
        }
        libc::syscall(libc::SYS_munmap, addr, len) as c_int
    }
}

/// # Safety
/// C `mremap` (see the module notes on its fifth argument).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the program calls this as C `mremap`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let a = old as usize;
        if let Some(rlen) = region_len(a) {
            if FORKED.load(Relaxed) || flags & libc::MREMAP_FIXED != 0 {
                set_errno(libc::EINVAL);
                return libc::MAP_FAILED;
            }
            if new_len <= rlen {
                if new_len < old_len.min(rlen) {
                    munmap(
                        (a + new_len.next_multiple_of(4096)) as *mut c_void,
                        rlen - new_len.min(rlen),
                    );
                }
                return old;
            }
            if flags & libc::MREMAP_MAYMOVE == 0 {
                set_errno(libc::ENOMEM);
                return libc::MAP_FAILED;
            }
            let q = match new_region(new_len, 4096, 0) {
                Got::Region(q) => q,
                Got::NoMemory | Got::Fallback => {
                    set_errno(libc::ENOMEM);
                    return libc::MAP_FAILED;
                }
            };
            std::ptr::copy_nonoverlapping(old as *const u8, q as *mut u8, old_len.min(rlen));
            free_region(a);
            return q;
        }
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}
