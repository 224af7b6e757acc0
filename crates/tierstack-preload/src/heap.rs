//! The malloc family: large requests become regions (the slot table maps their addresses),
//! the rest goes to glibc.

use super::*;

pub(crate) enum Got {
    Region(*mut c_void),
    /// The store cannot hold it: allocation failure.
    NoMemory,
    /// Paging is off: use ordinary memory.
    Fallback,
}

pub(crate) fn slot_insert(base: usize, len: usize) -> bool {
    for i in 0..SLOTS {
        if BASES[i]
            .compare_exchange(0, usize::MAX, SeqCst, SeqCst)
            .is_ok()
        {
            LENS[i].store(len, SeqCst);
            BASES[i].store(base, SeqCst);
            HIGH.fetch_max(i + 1, SeqCst);
            return true;
        }
    }
    false
}

/// The slot of the region starting at `p`.
pub(crate) fn slot_exact(p: usize) -> Option<usize> {
    let high = HIGH.load(Acquire);
    (0..high).find(|&i| BASES[i].load(Acquire) == p)
}

/// The slot of the region containing `p`.
pub(crate) fn slot_containing(p: usize) -> Option<(usize, usize, usize)> {
    let high = HIGH.load(Acquire);
    (0..high).find_map(|i| {
        let b = BASES[i].load(Acquire);
        let l = LENS[i].load(Acquire);
        (b != 0 && b != usize::MAX && p >= b && p < b + l).then_some((i, b, l))
    })
}

/// A new region of `size` bytes aligned to `align`, at `hint` when that is not 0 and the
/// kernel can place it there.
pub(crate) fn new_region(size: usize, align: usize, hint: usize) -> Got {
    let _b = Busy::enter();
    tierstack_mem::register_current_thread();
    let Some(e) = engine() else {
        return Got::Fallback;
    };
    let made = if hint != 0 {
        e.pager.map_near(size, hint)
    } else {
        e.pager.map(size, align)
    };
    match made {
        Ok(r) => {
            let p = r.as_ptr() as usize;
            if !slot_insert(p, r.len()) {
                return Got::Fallback;
            }
            // Under mlockall(MCL_FUTURE) the new mapping is locked (on fault, see `mlockall`):
            // the pager decides what of it is resident.
            // SAFETY: munlock of the region just made; it changes no contents.
            unsafe { libc::syscall(libc::SYS_munlock, p, r.len()) };
            e.regions.lock().insert(p, r);
            Got::Region(p as *mut c_void)
        }
        Err(MemError::NoSpace { .. }) => Got::NoMemory,
        Err(err) => {
            eprintln!(
                "tierstack: cannot map a region of {size} bytes ({err}); using ordinary memory"
            );
            Got::Fallback
        }
    }
}

/// Frees the region at `p` if it is one. In a forked child, regions belong to the parent and
/// are simply forgotten.
pub(crate) fn free_region(p: usize) -> bool {
    if p & 4095 != 0 {
        return false;
    }
    let Some(i) = slot_exact(p) else {
        return false;
    };
    if FORKED.load(Relaxed) {
        return true;
    }
    let _b = Busy::enter();
    BASES[i].store(0, SeqCst);
    let e = ENGINE.lock().clone();
    if let Some(e) = e {
        let r = e.regions.lock().remove(&p);
        drop(r);
    }
    true
}

pub(crate) fn region_len(p: usize) -> Option<usize> {
    if p & 4095 != 0 {
        return None;
    }
    slot_exact(p).map(|i| LENS[i].load(Acquire))
}

pub(crate) fn alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    if wants_region(size) {
        match new_region(size, align, 0) {
            Got::Region(p) => return p,
            Got::NoMemory => {
                set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            }
            Got::Fallback => {}
        }
    }
    // SAFETY: plain calls into glibc's allocator.
    unsafe {
        match (zero, align > 16) {
            (true, _) => __libc_calloc(1, size),
            (false, false) => __libc_malloc(size),
            (false, true) => __libc_memalign(align, size),
        }
    }
}

/// # Safety
/// C `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    alloc(size, 16, false)
}

/// # Safety
/// C `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `calloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        let Some(total) = n.checked_mul(size) else {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        if wants_region(total) {
            // Regions start as zero pages.
            return alloc(total, 16, false);
        }
        __libc_calloc(n, size)
    }
}

/// # Safety
/// C `free`: `p` is NULL or came from this allocator.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the program calls this as C `free`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() || free_region(p as usize) {
            return;
        }
        __libc_free(p)
    }
}

/// # Safety
/// C `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `realloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() {
            return malloc(size);
        }
        if let Some(len) = region_len(p as usize) {
            if size == 0 {
                free(p);
                return std::ptr::null_mut();
            }
            if size <= len {
                return p;
            }
            let q = malloc(size);
            if q.is_null() {
                return q;
            }
            std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, len);
            free(p);
            return q;
        }
        if wants_region(size) {
            let old = real_usable_size(p);
            match new_region(size, 16, 0) {
                Got::Region(q) => {
                    std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size));
                    __libc_free(p);
                    return q;
                }
                Got::NoMemory => {
                    set_errno(libc::ENOMEM);
                    return std::ptr::null_mut();
                }
                Got::Fallback => {}
            }
        }
        __libc_realloc(p, size)
    }
}

/// # Safety
/// C `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `reallocarray`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        match n.checked_mul(size) {
            Some(t) => realloc(p, t),
            None => {
                set_errno(libc::ENOMEM);
                std::ptr::null_mut()
            }
        }
    }
}

/// # Safety
/// C `posix_memalign`: `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    // SAFETY: the program calls this as C `posix_memalign`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
            return libc::EINVAL;
        }
        let p = alloc(size, align, false);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
        0
    }
}

/// # Safety
/// C `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    alloc(size, align, false)
}

/// # Safety
/// C `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `memalign`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// C `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `valloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if wants_region(size) {
            return alloc(size, 4096, false);
        }
        __libc_valloc(size)
    }
}

/// # Safety
/// C `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: the program calls this as C `pvalloc`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if wants_region(size) {
            return alloc(size, 4096, false);
        }
        __libc_pvalloc(size)
    }
}

/// The next definition of `name` after this library's (glibc's), looked up once into `cache`;
/// 0 when there is none.
pub(crate) fn next_symbol(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let mut f = cache.load(Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        cache.store(f, Relaxed);
    }
    f
}

pub(crate) unsafe fn real_usable_size(p: *mut c_void) -> usize {
    // SAFETY: the caller upholds this function's `# Safety` contract, which covers
    // every call and pointer access below.
    unsafe {
        type F = unsafe extern "C" fn(*mut c_void) -> size_t;
        static REAL: AtomicUsize = AtomicUsize::new(0);
        let f = next_symbol(&REAL, c"malloc_usable_size");
        if f == 0 {
            return 0;
        }
        // SAFETY: `f` is glibc's malloc_usable_size, found by dlsym.
        let real: F = std::mem::transmute::<usize, F>(f);
        real(p)
    }
}

/// # Safety
/// C `malloc_usable_size`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    // SAFETY: the program calls this as C `malloc_usable_size`; the calls and pointer
    // accesses below rely on its arguments following that C contract.
    unsafe {
        if p.is_null() {
            return 0;
        }
        region_len(p as usize).unwrap_or_else(|| real_usable_size(p))
    }
}
