//! The CUDA driver API, loaded at run time: nothing at build time needs CUDA, and a machine
//! without an NVIDIA driver gets a [`GpuError`] naming what is missing instead of a program
//! that does not start. Only the calls the VRAM tier needs: one context per device (the
//! device's primary context), device memory, and synchronous copies to and from it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

/// What opening or using a GPU can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No NVIDIA driver library on this machine.
    #[error("no NVIDIA driver: cannot load libcuda.so.1 ({0}); install the NVIDIA driver or leave out --vram")]
    NoDriver(String),
    /// The driver has fewer devices than asked for.
    #[error("no GPU {asked}: the driver reports {count} device(s); pick one below {count} with --gpu or leave out --vram")]
    NoDevice {
        /// The device ordinal asked for.
        asked: u32,
        /// Devices the driver sees.
        count: u32,
    },
    /// A driver call failed.
    #[error("CUDA {call} failed: {name} ({code})")]
    Call {
        /// The driver function.
        call: &'static str,
        /// The driver's error code.
        code: i32,
        /// The driver's name for it.
        name: String,
    },
    /// More device memory asked for than the device has free.
    #[error("GPU {device} has {free} bytes of memory free, {asked} asked for: give --vram a smaller size")]
    TooLarge {
        /// The device ordinal.
        device: u32,
        /// Bytes free on it.
        free: u64,
        /// Bytes asked for.
        asked: u64,
    },
}

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevPtr = u64;

/// The driver functions, resolved once.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevPtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevPtr) -> CuResult,
    mem_alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevPtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevPtr, usize) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Keeps the library loaded as long as the pointers above are used.
    _lib: libloading::Library,
}

impl Api {
    fn load() -> Result<Api, GpuError> {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
        // preconditions on the loading program.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }
            .map_err(|e| GpuError::NoDriver(e.to_string()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is a function of the CUDA driver API with the signature
                // of the field it is stored in (cuda.h, versioned `_v2` entry points where
                // the driver has them).
                *unsafe { lib.get($name) }
                    .map_err(|e: libloading::Error| GpuError::NoDriver(e.to_string()))?
            };
        }
        // Copies on the calling thread's own default stream where the driver has it, so that
        // copies of different threads do not wait for each other (the legacy default stream
        // serialises every copy of the context).
        macro_rules! sym_or {
            ($name:literal, $fallback:literal) => {
                // SAFETY: as for `sym!`: both names are the same driver function, the first
                // with per-thread default-stream semantics.
                match unsafe { lib.get($name) } {
                    Ok(f) => *f,
                    Err(_) => sym!($fallback),
                }
            };
        }
        Ok(Api {
            init: sym!(b"cuInit\0"),
            device_get_count: sym!(b"cuDeviceGetCount\0"),
            device_get: sym!(b"cuDeviceGet\0"),
            device_get_name: sym!(b"cuDeviceGetName\0"),
            device_total_mem: sym!(b"cuDeviceTotalMem_v2\0"),
            primary_ctx_retain: sym!(b"cuDevicePrimaryCtxRetain\0"),
            primary_ctx_release: sym!(b"cuDevicePrimaryCtxRelease_v2\0"),
            ctx_push: sym!(b"cuCtxPushCurrent_v2\0"),
            ctx_pop: sym!(b"cuCtxPopCurrent_v2\0"),
            mem_get_info: sym!(b"cuMemGetInfo_v2\0"),
            mem_alloc: sym!(b"cuMemAlloc_v2\0"),
            mem_free: sym!(b"cuMemFree_v2\0"),
            mem_alloc_host: sym!(b"cuMemAllocHost_v2\0"),
            mem_free_host: sym!(b"cuMemFreeHost\0"),
            memcpy_htod: sym_or!(b"cuMemcpyHtoD_v2_ptds\0", b"cuMemcpyHtoD_v2\0"),
            memcpy_dtoh: sym_or!(b"cuMemcpyDtoH_v2_ptds\0", b"cuMemcpyDtoH_v2\0"),
            get_error_name: sym!(b"cuGetErrorName\0"),
            _lib: lib,
        })
    }

    /// Initialises the driver; the number of devices it sees.
    fn devices(&self) -> Result<c_int, GpuError> {
        // SAFETY: cuInit takes flags (0) and may be called more than once.
        self.check("cuInit", unsafe { (self.init)(0) })?;
        let mut count: c_int = 0;
        // SAFETY: writes the device count into `count`.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut count)
        })?;
        Ok(count)
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<(), GpuError> {
        if code == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
        let named = unsafe { (self.get_error_name)(code, &mut p) };
        let name = if named == 0 && !p.is_null() {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "unknown error".to_string()
        };
        Err(GpuError::Call { call, code, name })
    }
}

/// The device's context pushed on this thread's context stack, popped on drop.
struct Current<'a> {
    api: &'a Api,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut c: CuContext = std::ptr::null_mut();
        // SAFETY: pops the context `Gpu::current` pushed on this thread.
        let _ = unsafe { (self.api.ctx_pop)(&mut c) };
    }
}

/// One GPU, through its primary context.
pub struct Gpu {
    api: Api,
    device: CuDevice,
    ordinal: u32,
    ctx: CuContext,
    name: String,
    total: u64,
}

// SAFETY: a CUDA context may be made current on any thread (every call below first makes it
// current on the calling thread), and the driver API is thread-safe.
unsafe impl Send for Gpu {}
// SAFETY: as for Send: no call relies on thread-local state set by another call.
unsafe impl Sync for Gpu {}

/// What the driver reports of one device, for `doctor`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// The device ordinal.
    pub ordinal: u32,
    /// The device's name.
    pub name: String,
    /// Its memory, bytes.
    pub total_bytes: u64,
    /// Its free memory now, bytes.
    pub free_bytes: u64,
}

impl Gpu {
    /// Opens device `ordinal` (0 is the first GPU).
    pub fn open(ordinal: u32) -> Result<Arc<Gpu>, GpuError> {
        let api = Api::load()?;
        let count = api.devices()?;
        if ordinal as c_int >= count {
            return Err(GpuError::NoDevice {
                asked: ordinal,
                count: count.max(0) as u32,
            });
        }
        let mut device: CuDevice = 0;
        // SAFETY: the ordinal is below the device count; writes the handle into `device`.
        api.check("cuDeviceGet", unsafe {
            (api.device_get)(&mut device, ordinal as c_int)
        })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the driver writes at most `name.len()` bytes, NUL-terminated.
        api.check("cuDeviceGetName", unsafe {
            (api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, device)
        })?;
        // SAFETY: `name` is NUL-terminated (written by the driver, zero-filled before).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total: usize = 0;
        // SAFETY: writes the device's memory size into `total`.
        api.check("cuDeviceTotalMem", unsafe {
            (api.device_total_mem)(&mut total, device)
        })?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: retains the device's primary context, released in Drop.
        api.check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut ctx, device)
        })?;
        Ok(Arc::new(Gpu {
            api,
            device,
            ordinal,
            ctx,
            name,
            total: total as u64,
        }))
    }

    /// Every device the driver sees, or why none can be listed.
    pub fn list() -> Result<Vec<GpuInfo>, GpuError> {
        let count = Api::load()?.devices()?;
        (0..count.max(0) as u32)
            .map(|i| Gpu::open(i).and_then(|g| g.info()))
            .collect()
    }

    /// Makes the device's context current on this thread until the guard drops; the thread's
    /// own current context (a CUDA program's under `run --vram`) is current again after.
    fn current(&self) -> Result<Current<'_>, GpuError> {
        // SAFETY: the context was retained in `open` and lives until Drop; the guard pops it.
        let code = unsafe { (self.api.ctx_push)(self.ctx) };
        self.api.check("cuCtxPushCurrent", code)?;
        Ok(Current { api: &self.api })
    }

    /// The device's name, memory and free memory.
    pub fn info(&self) -> Result<GpuInfo, GpuError> {
        let _c = self.current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes the free and total bytes of the current context's device.
        self.api.check("cuMemGetInfo", unsafe {
            (self.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok(GpuInfo {
            ordinal: self.ordinal,
            name: self.name.clone(),
            total_bytes: self.total,
            free_bytes: free as u64,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `bytes` of device memory, freed when the buffer is dropped.
    pub fn alloc(self: &Arc<Self>, bytes: u64) -> Result<DeviceBuf, GpuError> {
        let info = self.info()?;
        if bytes > info.free_bytes {
            return Err(GpuError::TooLarge {
                device: self.ordinal,
                free: info.free_bytes,
                asked: bytes,
            });
        }
        let mut ptr: CuDevPtr = 0;
        {
            let _c = self.current()?;
            // SAFETY: allocates `bytes` of device memory in the current context.
            let code = unsafe { (self.api.mem_alloc)(&mut ptr, bytes as usize) };
            self.api.check("cuMemAlloc", code)?;
        }
        // Made now, so that its Drop frees the device memory if staging memory fails.
        let mut buf = DeviceBuf {
            gpu: self.clone(),
            ptr,
            len: bytes,
            stages: Vec::new(),
            next: AtomicUsize::new(0),
        };
        // Copies need page-locked staging memory: from pageable memory a copy to the device
        // may return before the device has the bytes, unordered with other threads' reads.
        for _ in 0..STAGES {
            match self.pinned(STAGE_BYTES) {
                Ok(p) => buf.stages.push(Mutex::new(p)),
                Err(e) if buf.stages.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(buf)
    }

    /// `len` bytes of page-locked host memory (the device copies it without staging).
    fn pinned(self: &Arc<Self>, len: usize) -> Result<Pinned, GpuError> {
        let _c = self.current()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: allocates `len` bytes of page-locked host memory in the current context.
        let code = unsafe { (self.api.mem_alloc_host)(&mut p, len) };
        self.api.check("cuMemAllocHost", code)?;
        let pinned = Pinned {
            gpu: self.clone(),
            ptr: p.cast(),
            len,
        };
        // Never read before written, but a slice over it should hold initialised bytes.
        // SAFETY: `p` points to `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(pinned.ptr, 0, len) };
        Ok(pinned)
    }
}

/// Staging buffers per device block: copies go through page-locked memory, several at once.
const STAGES: usize = 4;
/// Bytes of each staging buffer (larger copies go in pieces).
const STAGE_BYTES: usize = 2 << 20;

/// Page-locked host memory, freed on drop.
struct Pinned {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; it is used by one thread at a
// time (each `Pinned` sits in a Mutex).
unsafe impl Send for Pinned {}

impl Pinned {
    fn bytes(&mut self, n: usize) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` bytes of host memory this value owns, and `&mut self`
        // makes this the only reference to them; `n` is at most `len` (callers chunk by it).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n.min(self.len)) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Ok(_c) = self.gpu.current() {
            // SAFETY: frees the page-locked memory allocated in `Gpu::pinned`, once.
            let _ = unsafe { (self.gpu.api.mem_free_host)(self.ptr.cast()) };
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the primary context retained in `open`, once.
        let _ = unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

/// A block of device memory.
pub struct DeviceBuf {
    gpu: Arc<Gpu>,
    ptr: CuDevPtr,
    len: u64,
    /// Staging buffers, at least one: every copy goes through page-locked memory, which
    /// makes it synchronous with the device.
    stages: Vec<Mutex<Pinned>>,
    next: AtomicUsize,
}

impl DeviceBuf {
    /// Its size, bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, offset: u64, n: usize) -> Result<CuDevPtr, GpuError> {
        match offset.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok(self.ptr + offset),
            _ => Err(GpuError::Call {
                call: "copy",
                code: 1,
                name: format!(
                    "{n} bytes at offset {offset} pass the end of a {}-byte buffer",
                    self.len
                ),
            }),
        }
    }

    /// A free staging buffer (the next one in turn when all are busy); there is at least one.
    fn stage(&self) -> parking_lot::MutexGuard<'_, Pinned> {
        let n = self.stages.len().max(1);
        let first = self.next.fetch_add(1, Relaxed) % n;
        (0..n)
            .find_map(|i| self.stages.get((first + i) % n).and_then(|m| m.try_lock()))
            .unwrap_or_else(|| self.stages[first].lock())
    }

    /// Copies `data` to `offset` (returns when the device has it).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), GpuError> {
        let dst = self.range(offset, data.len())?;
        let _c = self.gpu.current()?;
        let mut stage = self.stage();
        let mut at = 0;
        for piece in data.chunks(STAGE_BYTES) {
            let buf = stage.bytes(piece.len());
            buf.copy_from_slice(piece);
            // SAFETY: the destination lies inside this allocation (`range` checked the whole
            // copy) and the source is the staging buffer, which holds `piece.len()` bytes; the
            // copy is synchronous, so the buffer is not reused before it is done.
            self.gpu.api.check("cuMemcpyHtoD", unsafe {
                (self.gpu.api.memcpy_htod)(dst + at, buf.as_ptr().cast(), piece.len())
            })?;
            at += piece.len() as u64;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), GpuError> {
        let src = self.range(offset, out.len())?;
        let _c = self.gpu.current()?;
        let mut stage = self.stage();
        let mut at = 0;
        for piece in out.chunks_mut(STAGE_BYTES) {
            let buf = stage.bytes(piece.len());
            // SAFETY: the source lies inside this allocation (`range` checked the whole copy)
            // and the destination is the staging buffer, which holds `piece.len()` bytes; the
            // copy is synchronous.
            self.gpu.api.check("cuMemcpyDtoH", unsafe {
                (self.gpu.api.memcpy_dtoh)(buf.as_mut_ptr().cast(), src + at, piece.len())
            })?;
            piece.copy_from_slice(buf);
            at += piece.len() as u64;
        }
        Ok(())
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        if let Ok(_c) = self.gpu.current() {
            // SAFETY: frees the allocation made in `Gpu::alloc`, once.
            let _ = unsafe { (self.gpu.api.mem_free)(self.ptr) };
        }
    }
}
