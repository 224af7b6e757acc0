//! `tierstack bench array`: raw drives (the baseline) against the array on the same drives,
//! with the same io engine and 1 MiB requests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use serde::Serialize;
use tierstack_array::io::{make_engine, AlignedBuf, DriveFile, EngineKind, IoOp};
use tierstack_array::{parity, Array, ArrayOptions, CreateParams, Level};

/// Settings of one `bench array` run.
#[derive(Debug, Clone)]
pub struct ArrayBenchOpts {
    /// RAID level of the array.
    pub level: Level,
    /// Number of drive files, all made in `dir`.
    pub drives: usize,
    /// Folder for the drive files (and the spare); they are created there and removed afterwards.
    pub dir: PathBuf,
    /// Bytes per drive.
    pub size: u64,
    /// Chunk size of the array in bytes.
    pub chunk: usize,
    /// Number of parity groups for RAID 50 and 60 (None: the array's default).
    pub groups: Option<usize>,
    /// I/O engine of both the raw-drive baseline and the array.
    pub engine: EngineKind,
    /// Queue depth of the I/O engine (the raw passes use at least 8).
    pub queue_depth: u32,
    /// Reader threads of the array's sequential reads; the random reads use twice as many.
    pub threads: usize,
    /// Seconds of random reads.
    pub rand_seconds: f64,
    /// Runs of the whole sequence; the report gives the median of each figure.
    pub repeat: usize,
}

/// The figures of `bench array` (its JSON output). Rates named `_mbps` are MiB/s (2^20 bytes
/// per second); every ratio compares with a baseline taken in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct ArrayBenchReport {
    /// RAID level number.
    pub level: u32,
    /// Number of drives.
    pub drives: usize,
    /// Drives' worth of user data per row: the drives minus those holding parity or mirror copies.
    pub data_drives: usize,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// Size of each drive file in bytes.
    pub drive_size: u64,
    /// Folder that held the drive files.
    pub dir: String,
    /// Name of the I/O engine the array used.
    pub engine: String,
    /// Whether every raw drive file was opened with O_DIRECT.
    pub direct_io: bool,
    /// Baseline: sequential write rate of all raw drives together, 1 MiB requests with four in
    /// flight per drive, up to the fdatasync.
    pub raw_write_mbps: f64,
    /// Baseline: sequential read rate of all raw drives together, as the write.
    pub raw_read_mbps: f64,
    /// Array sequential write of 1 MiB values filling 60 % of its capacity, up to the flush, in
    /// user bytes per second.
    pub seq_write_mbps: f64,
    /// Array sequential read of those values with `threads` readers, in user bytes per second.
    pub seq_read_mbps: f64,
    /// Random 4 KiB reads per second from the array, over 64 MiB of pages.
    pub rand_read_iops: f64,
    /// Sequential read rate with the last drive failed (0 for a level without redundancy).
    pub degraded_read_mbps: f64,
    /// Rate of the rebuild onto a spare, in bytes written to the spare per second (0 for a level
    /// without redundancy).
    pub rebuild_mbps: f64,
    /// What the rebuild read from the surviving drives per second (every other drive is read).
    pub rebuild_read_mbps: f64,
    /// rebuild_read_mbps / raw_read_mbps: how close the rebuild runs to the drives' read limit.
    pub rebuild_read_ratio: f64,
    /// XOR parity rate of one core, GB/s (10^9 bytes per second) of source data.
    pub xor_gbps_per_core: f64,
    /// seq_write_mbps / (raw_write_mbps x data_drives / drives): the array's write rate against the
    /// drives' raw rate for the share that holds user data.
    pub seq_write_ratio: f64,
    /// degraded_read_mbps / seq_read_mbps: reads with a failed drive against healthy reads.
    pub degraded_read_ratio: f64,
    /// rebuild_mbps / (raw_write_mbps / drives): the rebuild against one drive's write rate.
    pub rebuild_ratio: f64,
    /// Bytes the array wrote to its drives during the sequential write (taken from the first run,
    /// not a median).
    pub bytes_written: u64,
    /// bytes_written / user bytes of the sequential write: write amplification at the drives.
    pub write_amplification_drives: f64,
    /// How many runs the figures are the median of.
    pub runs: usize,
}

/// What can go wrong in `bench array`.
#[derive(Debug, thiserror::Error)]
pub enum ArrayBenchError {
    /// The array returned an error.
    #[error("{0}")]
    Array(#[from] tierstack_array::ArrayError),
    /// An I/O call on a drive file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path (e.g. `open /tmp/x`).
        what: String,
        /// The error of the call.
        #[source]
        source: std::io::Error,
    },
    /// The benchmark found data read back wrong, or a reader thread panicked.
    #[error("{0}")]
    Invalid(String),
}

fn ioe(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ArrayBenchError {
    let what = what.into();
    move |source| ArrayBenchError::Io { what, source }
}

const REQ: usize = 1 << 20;

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// Runs `ops_per_drive` 1 MiB requests on every drive, several in flight per drive.
fn raw_pass(
    paths: &[PathBuf],
    bytes_per_drive: u64,
    write: bool,
    engine: EngineKind,
    qd: u32,
) -> Result<(Duration, bool), ArrayBenchError> {
    let eng = make_engine(engine, qd.max(8));
    let files: Vec<DriveFile> = paths
        .iter()
        .map(|p| DriveFile::open(p, true).map_err(ioe(format!("open {}", p.display()))))
        .collect::<Result<_, _>>()?;
    let direct = files.iter().all(|f| f.direct);
    let per_drive_inflight = 4usize;
    let mut bufs: Vec<AlignedBuf> = (0..files.len() * per_drive_inflight)
        .map(|i| {
            let mut b = AlignedBuf::new(REQ);
            b.fill((i * 37 + 1) as u8);
            b
        })
        .collect();
    let reqs = bytes_per_drive / REQ as u64;
    let start = Instant::now();
    let mut r = 0u64;
    while r < reqs {
        let n = per_drive_inflight.min((reqs - r) as usize);
        let mut ops = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            let (d, j) = (i / per_drive_inflight, i % per_drive_inflight);
            if j >= n {
                continue;
            }
            let offset = (1 << 20) + (r + j as u64) * REQ as u64;
            let fd = files[d].fd();
            ops.push(if write {
                IoOp::Write {
                    fd,
                    offset,
                    buf: &b[..],
                }
            } else {
                IoOp::Read {
                    fd,
                    offset,
                    buf: &mut b[..],
                }
            });
        }
        for res in eng.submit(&mut ops) {
            res.map_err(ioe("raw drive I/O"))?;
        }
        r += n as u64;
    }
    if write {
        for f in &files {
            f.sync().map_err(ioe("fdatasync"))?;
        }
    }
    Ok((start.elapsed(), direct))
}

fn seq_read(a: &Array, keys: &[(u64, u64)], threads: usize) -> Result<Duration, ArrayBenchError> {
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let res: Result<(), ArrayBenchError> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), ArrayBenchError> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= keys.len() {
                            return Ok(());
                        }
                        let v = a.get(keys[i])?;
                        if v.map(|v| v.len()) != Some(REQ) {
                            return Err(ArrayBenchError::Invalid(format!(
                                "key {:?} read back wrong",
                                keys[i]
                            )));
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| ArrayBenchError::Invalid("reader thread panicked".into()))??;
        }
        Ok(())
    });
    res?;
    Ok(start.elapsed())
}

/// XOR parity rate of one core over `k` 1 MiB sources, in GB/s of source data.
pub fn xor_rate(k: usize) -> f64 {
    let k = k.max(2);
    let srcs: Vec<Vec<u8>> = (0..k).map(|i| vec![i as u8 + 1; REQ]).collect();
    let refs: Vec<&[u8]> = srcs.iter().map(|v| v.as_slice()).collect();
    let mut dst = vec![0u8; REQ];
    let mut iters = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        parity::xor_parity(&mut dst, &refs);
        iters += 1;
    }
    std::hint::black_box(&dst);
    (iters * (k * REQ) as u64) as f64 / 1e9 / start.elapsed().as_secs_f64()
}

/// Runs the benchmark `o.repeat` times and reports the median of every figure (each ratio is
/// the median of the per-run ratios, every run carrying its own baseline).
pub fn run(o: &ArrayBenchOpts, log: &dyn Fn(&str)) -> Result<ArrayBenchReport, ArrayBenchError> {
    let n = o.repeat.max(1);
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        if n > 1 {
            log(&format!("run {} of {n}", i + 1));
        }
        runs.push(run_once(o, log)?);
    }
    let med = |f: &dyn Fn(&ArrayBenchReport) -> f64| -> f64 {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mut r = runs[0].clone();
    r.runs = n;
    r.raw_write_mbps = med(&|x| x.raw_write_mbps);
    r.raw_read_mbps = med(&|x| x.raw_read_mbps);
    r.seq_write_mbps = med(&|x| x.seq_write_mbps);
    r.seq_read_mbps = med(&|x| x.seq_read_mbps);
    r.rand_read_iops = med(&|x| x.rand_read_iops);
    r.degraded_read_mbps = med(&|x| x.degraded_read_mbps);
    r.rebuild_mbps = med(&|x| x.rebuild_mbps);
    r.rebuild_read_mbps = med(&|x| x.rebuild_read_mbps);
    r.rebuild_read_ratio = med(&|x| x.rebuild_read_ratio);
    r.xor_gbps_per_core = med(&|x| x.xor_gbps_per_core);
    r.seq_write_ratio = med(&|x| x.seq_write_ratio);
    r.degraded_read_ratio = med(&|x| x.degraded_read_ratio);
    r.rebuild_ratio = med(&|x| x.rebuild_ratio);
    r.write_amplification_drives = med(&|x| x.write_amplification_drives);
    Ok(r)
}

fn run_once(o: &ArrayBenchOpts, log: &dyn Fn(&str)) -> Result<ArrayBenchReport, ArrayBenchError> {
    std::fs::create_dir_all(&o.dir).map_err(ioe(format!("create {}", o.dir.display())))?;
    let tag = format!("tsbench-{}", std::process::id());
    let paths: Vec<PathBuf> = (0..o.drives)
        .map(|i| o.dir.join(format!("{tag}-d{i}")))
        .collect();
    let spare = o.dir.join(format!("{tag}-spare"));
    let cleanup = |ps: &[PathBuf]| {
        for p in ps.iter().chain(std::iter::once(&spare)) {
            let _ = std::fs::remove_file(p);
        }
    };
    let res = run_inner(o, &paths, &spare, log);
    cleanup(&paths);
    res
}

fn make_file(p: &Path, size: u64) -> Result<(), ArrayBenchError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(p)
        .map_err(ioe(format!("create {}", p.display())))?;
    f.set_len(size)
        .map_err(ioe(format!("size {}", p.display())))?;
    // Allocate the blocks up front, so neither the baseline nor the array pays for allocation.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, size).map_err(|e| {
        ArrayBenchError::Io {
            what: format!("fallocate {}", p.display()),
            source: e.into(),
        }
    })
}

fn run_inner(
    o: &ArrayBenchOpts,
    paths: &[PathBuf],
    spare: &Path,
    log: &dyn Fn(&str),
) -> Result<ArrayBenchReport, ArrayBenchError> {
    let params = CreateParams {
        level: o.level,
        chunk: o.chunk,
        groups: o.groups,
        size: Some(o.size),
    };
    // Validate before writing anything.
    let geo = tierstack_array::Geometry::new(o.level, o.drives, o.chunk, o.groups, o.size)?;
    for p in paths {
        make_file(p, o.size)?;
    }
    let raw_bytes = (o.size - (1 << 20)) / REQ as u64 * REQ as u64;
    // A first, untimed pass writes every block once: file systems (tmpfs above all) pay for
    // first-touch allocation that neither the baseline nor the array should be charged with.
    log("raw drives: prefill");
    raw_pass(paths, raw_bytes, true, o.engine, o.queue_depth)?;
    log("raw drives: sequential write");
    let (t, direct) = raw_pass(paths, raw_bytes, true, o.engine, o.queue_depth)?;
    let raw_write = mbps(raw_bytes * o.drives as u64, t);
    log("raw drives: sequential read");
    let (t, _) = raw_pass(paths, raw_bytes, false, o.engine, o.queue_depth)?;
    let raw_read = mbps(raw_bytes * o.drives as u64, t);
    // The raw pass leaves no superblock, so the array may be created over the same files.
    let opts = ArrayOptions {
        engine: o.engine,
        queue_depth: o.queue_depth,
        direct: true,
        ..ArrayOptions::default()
    };
    let a = Array::create(paths, &params, &opts)?;
    let cap = a.status().capacity_bytes;
    let nvals = ((cap as f64 * 0.6) as u64 / REQ as u64).max(1);
    let mut val = vec![0u8; REQ];
    rand::thread_rng().fill(&mut val[..]);
    log(&format!("array: sequential write of {nvals} x 1 MiB"));
    let keys: Vec<(u64, u64)> = (0..nvals).map(|i| (1, i)).collect();
    let start = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        val[0..8].copy_from_slice(&(i as u64).to_le_bytes());
        a.put(*k, &val)?;
    }
    a.flush()?;
    let t = start.elapsed();
    let seq_write = mbps(nvals * REQ as u64, t);
    let written = a.drive_bytes_written();
    log("array: sequential read");
    let threads = o.threads.max(1);
    let seq_read_mbps = mbps(nvals * REQ as u64, seq_read(&a, &keys, threads)?);
    // Random 4 KiB page reads over 64 MiB of pages.
    log("array: random 4 KiB reads");
    let npages = 16384u64;
    let page = vec![7u8; 4096];
    for i in 0..npages {
        a.put((2, i), &page)?;
    }
    a.flush()?;
    let count = AtomicU64::new(0);
    let dur = Duration::from_secs_f64(o.rand_seconds.max(0.2));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads * 2 {
            s.spawn(|| {
                let mut rng = rand::thread_rng();
                while start.elapsed() < dur {
                    let k = rng.gen_range(0..npages);
                    if let Ok(Some(_)) = a.get((2, k)) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let rand_iops = count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let (degraded, rebuild) = if geo.m > 0 {
        let victim = o.drives - 1;
        log(&format!(
            "array: sequential read with drive {victim} failed"
        ));
        a.fail_drive(victim)?;
        let degraded = mbps(nvals * REQ as u64, seq_read(&a, &keys, threads)?);
        log("array: rebuild onto a spare");
        make_file(spare, o.size)?;
        raw_pass(
            &[spare.to_path_buf()],
            raw_bytes,
            true,
            o.engine,
            o.queue_depth,
        )?;
        a.replace_drive(victim, spare)?;
        let start = Instant::now();
        let bytes = a.rebuild(None, &|_, _| {})?;
        let rebuild = mbps(bytes, start.elapsed());
        (degraded, rebuild)
    } else {
        (0.0, 0.0)
    };
    log("xor parity on one core");
    let xor = xor_rate(geo.k.max(2));
    let data_frac = geo.data_units() as f64 / o.drives as f64;
    let r = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    let report = ArrayBenchReport {
        level: o.level.number(),
        drives: o.drives,
        data_drives: geo.data_units(),
        chunk: o.chunk,
        drive_size: o.size,
        dir: o.dir.display().to_string(),
        engine: a.engine_name().to_string(),
        direct_io: direct,
        raw_write_mbps: raw_write,
        raw_read_mbps: raw_read,
        seq_write_mbps: seq_write,
        seq_read_mbps,
        rand_read_iops: rand_iops,
        degraded_read_mbps: degraded,
        rebuild_mbps: rebuild,
        rebuild_read_mbps: rebuild * (o.drives - 1) as f64,
        rebuild_read_ratio: r(rebuild * (o.drives - 1) as f64, raw_read),
        xor_gbps_per_core: xor,
        seq_write_ratio: r(seq_write, raw_write * data_frac),
        degraded_read_ratio: r(degraded, seq_read_mbps),
        rebuild_ratio: r(rebuild, raw_write / o.drives as f64),
        bytes_written: written,
        write_amplification_drives: r(written as f64, (nvals * REQ as u64) as f64),
        runs: 1,
    };
    drop(a);
    Ok(report)
}

/// The report as a two-column table.
pub fn render(r: &ArrayBenchReport) -> String {
    let rows = vec![
        vec![
            "raw drives write (all)".into(),
            format!("{:.0} MB/s", r.raw_write_mbps),
            "baseline".into(),
        ],
        vec![
            "raw drives read (all)".into(),
            format!("{:.0} MB/s", r.raw_read_mbps),
            "baseline".into(),
        ],
        vec![
            "array sequential write".into(),
            format!("{:.0} MB/s", r.seq_write_mbps),
            format!(
                "ratio {:.2} of raw x {}/{}",
                r.seq_write_ratio, r.data_drives, r.drives
            ),
        ],
        vec![
            "array sequential read".into(),
            format!("{:.0} MB/s", r.seq_read_mbps),
            format!("{:.2} of raw", r.seq_read_mbps / r.raw_read_mbps.max(1e-9)),
        ],
        vec![
            "array random 4 KiB read".into(),
            format!("{:.0} IOPS", r.rand_read_iops),
            String::new(),
        ],
        vec![
            "degraded sequential read".into(),
            format!("{:.0} MB/s", r.degraded_read_mbps),
            format!("ratio {:.2} of healthy", r.degraded_read_ratio),
        ],
        vec![
            "rebuild".into(),
            format!("{:.0} MB/s", r.rebuild_mbps),
            format!("ratio {:.2} of one drive's write", r.rebuild_ratio),
        ],
        vec![
            "rebuild reads (other drives)".into(),
            format!("{:.0} MB/s", r.rebuild_read_mbps),
            format!("{:.2} of raw read", r.rebuild_read_ratio),
        ],
        vec![
            "XOR parity, one core".into(),
            format!("{:.1} GB/s", r.xor_gbps_per_core),
            String::new(),
        ],
    ];
    format!(
        "RAID {} over {} drives of {} in {} (chunk {}, engine {}, O_DIRECT {}, median of {} runs)\n{}",
        r.level,
        r.drives,
        crate::fmt_size(r.drive_size),
        r.dir,
        crate::fmt_size(r.chunk as u64),
        r.engine,
        if r.direct_io { "yes" } else { "no" },
        r.runs,
        crate::table::render(&["measure", "value", "against baseline"], &rows)
    )
}
