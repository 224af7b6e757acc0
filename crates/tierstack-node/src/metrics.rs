//! Prometheus metrics: `tierstack mount --metrics ADDR:PORT` (served by the mount daemon) and
//! `tierstack run --metrics ADDR:PORT` (served by the `tierstack run` process) answer
//! `GET /metrics` in the Prometheus text format (the `prometheus` crate's encoder).
//!
//! The mount daemon refreshes its figures at each scrape from its own control socket
//! (`tierstack_fs::mount::status`), /proc/self and the block devices of its drives. Two
//! latency histograms are measured here: the control socket's status round trip and a statfs
//! probe through the mount every second (a client's view of how quickly the mount answers).
//! The FUSE operations' own latencies (from the daemon's per-operation histograms, which
//! `status` reports in the shared buckets of `tierstack_common::latency`) and a run's fault
//! service times (from the pager's bucket counters, which each paged process publishes about
//! once a second) are exported as Prometheus histograms with those buckets: [`Buckets`]
//! builds them with the `prometheus` crate's data model, since its own `Histogram` can only
//! be observed into, not set.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{NodeError, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::sync::Mutex;

use tierstack_fs::mount::MountStatus;

use crate::labels::{mount_owner, run_owner, Owner};
use crate::probe::{dev_counters, dev_name, open_files, proc_io, rss_bytes};
use crate::runs::{run_counters, RunRecord};

/// Parses ADDR:PORT and binds it, with a one-line error naming the fix (`--metrics`).
pub fn bind(addr: &str) -> Result<TcpListener> {
    bind_flag("metrics", addr, "127.0.0.1:9464")
}

/// Parses the ADDR:PORT given to `--FLAG` and binds it; a bad or busy address is a usage
/// error that names the flag and a free address such as `example`.
pub fn bind_flag(flag: &str, addr: &str, example: &str) -> Result<TcpListener> {
    let sa: SocketAddr = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| {
            NodeError::Usage(format!(
                "--{flag} {addr} is not an address: give ADDR:PORT, e.g. {example}"
            ))
        })?;
    TcpListener::bind(sa).map_err(|e| {
        NodeError::Usage(format!(
            "--{flag} {addr}: cannot listen there ({e}): pick a free port, e.g. --{flag} {example}"
        ))
    })
}

/// Checks that `addr` can be listened on (binds and releases it).
pub fn check_addr(addr: &str) -> Result<()> {
    bind(addr).map(drop)
}

/// Serves `/metrics` on `listener` in a thread: `refresh` updates the registry's figures
/// before each answer. One connection at a time, each bounded by 5 s timeouts.
pub fn serve(
    listener: TcpListener,
    reg: Registry,
    mut refresh: impl FnMut() + Send + 'static,
) -> Result<()> {
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(s) = conn else { continue };
                if let Err(e) = answer(s, &reg, &mut refresh) {
                    tracing::debug!("metrics connection: {e}");
                }
            }
        })
        .map_err(|source| NodeError::Io {
            what: "cannot start the metrics thread".into(),
            source,
        })?;
    Ok(())
}

fn answer(s: TcpStream, reg: &Registry, refresh: &mut impl FnMut()) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut first = String::new();
    r.read_line(&mut first)?;
    // Skip the headers (bounded).
    let mut n = 0;
    loop {
        let mut l = String::new();
        if r.read_line(&mut l)? == 0 || l == "\r\n" || l == "\n" || n > 100 {
            break;
        }
        n += 1;
    }
    let path = first.split_whitespace().nth(1).unwrap_or("");
    let mut w = s;
    if !first.starts_with("GET ") || !(path == "/metrics" || path.starts_with("/metrics?")) {
        let body = "tierstack: only GET /metrics is served here\n";
        write!(
            w,
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    }
    refresh();
    let enc = TextEncoder::new();
    let mut body = Vec::new();
    if let Err(e) = enc.encode(&reg.gather(), &mut body) {
        let msg = format!("encoding failed: {e}\n");
        write!(
            w,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{msg}",
            msg.len()
        )?;
        return Ok(());
    }
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        enc.format_type(),
        body.len()
    )?;
    w.write_all(&body)?;
    w.flush()
}

fn reg_err(e: prometheus::Error) -> NodeError {
    NodeError::Registry(e)
}

/// Raises an integer counter to `total` (counters only go up; a lower total is ignored).
fn set_counter(c: &IntCounterVec, labels: &[&str], total: u64) {
    let c = c.with_label_values(labels);
    c.inc_by(total.saturating_sub(c.get()));
}

/// A family of Prometheus histograms whose buckets are counted elsewhere (a daemon's
/// per-operation histograms, a pager's fault histogram) and set here at each scrape, in the
/// shared buckets of `tierstack_common::latency`.
#[derive(Clone)]
pub struct Buckets(Arc<BucketsInner>);

type LabelValues = Vec<String>;
/// Per-bucket counts and their sum in seconds.
type Series = (Vec<u64>, f64);

struct BucketsInner {
    desc: Desc,
    labels: Vec<String>,
    series: Mutex<BTreeMap<LabelValues, Series>>,
}

impl Buckets {
    /// A histogram family `name` with `labels`, registered in `reg`.
    pub fn register(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<Buckets> {
        let desc = Desc::new(
            name.into(),
            help.into(),
            labels.iter().map(|l| l.to_string()).collect(),
            Default::default(),
        )
        .map_err(reg_err)?;
        let b = Buckets(Arc::new(BucketsInner {
            desc,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            series: Mutex::new(BTreeMap::new()),
        }));
        reg.register(Box::new(b.clone())).map_err(reg_err)?;
        Ok(b)
    }

    /// Sets the series of `values` (one per label) to per-bucket `counts` (not cumulative;
    /// the last one the overflow bucket) and their sum in seconds.
    pub fn set(&self, values: &[&str], counts: &[u64], sum_seconds: f64) {
        let mut series = self.0.series.lock().unwrap_or_else(|p| p.into_inner());
        series.insert(
            values.iter().map(|v| v.to_string()).collect(),
            (counts.to_vec(), sum_seconds),
        );
    }

    /// Drops every series (the next [`Buckets::set`]s set those still there).
    pub fn clear(&self) {
        let mut series = self.0.series.lock().unwrap_or_else(|p| p.into_inner());
        series.clear();
    }
}

impl Collector for Buckets {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut mf = MetricFamily::default();
        mf.set_name(self.0.desc.fq_name.clone());
        mf.set_help(self.0.desc.help.clone());
        mf.set_field_type(MetricType::HISTOGRAM);
        let series = self.0.series.lock().unwrap_or_else(|p| p.into_inner());
        for (values, (counts, sum)) in series.iter() {
            let mut h = proto::Histogram::default();
            let mut cum = 0;
            let mut bs = Vec::new();
            for (i, &bound) in tierstack_common::LATENCY_BOUNDS_US.iter().enumerate() {
                cum += counts.get(i).copied().unwrap_or(0);
                let mut b = proto::Bucket::default();
                b.set_upper_bound(bound as f64 / 1e6);
                b.set_cumulative_count(cum);
                bs.push(b);
            }
            h.set_bucket(bs);
            h.set_sample_count(counts.iter().sum());
            h.set_sample_sum(*sum);
            let mut m = proto::Metric::default();
            let mut pairs: Vec<proto::LabelPair> = self
                .0
                .labels
                .iter()
                .zip(values)
                .map(|(n, v)| {
                    let mut l = proto::LabelPair::default();
                    l.set_name(n.clone());
                    l.set_value(v.clone());
                    l
                })
                .collect();
            // By name, as the crate's own metrics are.
            pairs.sort_by(|a, b| a.name().cmp(b.name()));
            m.set_label(pairs);
            m.set_histogram(h);
            mf.mut_metric().push(m);
        }
        if mf.get_metric().is_empty() {
            return Vec::new();
        }
        vec![mf]
    }
}

/// Latency buckets (seconds) from 10 µs to 10 s.
fn latency_buckets() -> Vec<f64> {
    let mut v = Vec::new();
    let mut x = 1e-5;
    while x < 11.0 {
        v.push(x);
        v.push(x * 2.5);
        v.push(x * 5.0);
        x *= 10.0;
    }
    v
}

/// The labels of a mount's series: where it is mounted, the SLURM job, the user.
pub const MOUNT_LABELS: [&str; 3] = ["mountpoint", "slurm_job", "user"];

/// The labels of a run's series: the program's pid, the SLURM job, the user.
pub const RUN_LABELS: [&str; 3] = ["pid", "slurm_job", "user"];

/// `base` followed by `more`.
fn with<'a>(base: &[&'a str; 3], more: &'a str) -> [&'a str; 4] {
    [base[0], base[1], base[2], more]
}

/// What registers the families of one registry: integer and float gauges, counters.
struct Families<'a>(&'a Registry);

impl Families<'_> {
    fn ig(&self, n: &str, h: &str, l: &[&str]) -> Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(n, h), l).map_err(reg_err)?;
        self.0.register(Box::new(g.clone())).map_err(reg_err)?;
        Ok(g)
    }

    fn fg(&self, n: &str, h: &str, l: &[&str]) -> Result<GaugeVec> {
        let g = GaugeVec::new(Opts::new(n, h), l).map_err(reg_err)?;
        self.0.register(Box::new(g.clone())).map_err(reg_err)?;
        Ok(g)
    }

    fn ic(&self, n: &str, h: &str, l: &[&str]) -> Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(n, h), l).map_err(reg_err)?;
        self.0.register(Box::new(c.clone())).map_err(reg_err)?;
        Ok(c)
    }

    fn hist(&self, n: &str, h: &str, l: &[&str]) -> Result<HistogramVec> {
        let x = HistogramVec::new(HistogramOpts::new(n, h).buckets(latency_buckets()), l)
            .map_err(reg_err)?;
        self.0.register(Box::new(x.clone())).map_err(reg_err)?;
        Ok(x)
    }
}

/// The block devices that hold drives of the processes exported (whole devices, as iostat;
/// one series per device however many mounts and runs share it).
pub struct Devices {
    read_bytes: IntCounterVec,
    write_bytes: IntCounterVec,
    reads: IntCounterVec,
    writes: IntCounterVec,
}

impl Devices {
    /// Registers the device families in `reg`.
    pub fn new(reg: &Registry) -> Result<Devices> {
        let f = Families(reg);
        let d = ["device"];
        Ok(Devices {
            read_bytes: f.ic("tierstack_device_read_bytes_total", "Bytes read from a block device that holds drives of this process (whole device, as iostat)", &d)?,
            write_bytes: f.ic("tierstack_device_written_bytes_total", "Bytes written to a block device that holds drives of this process (whole device, as iostat)", &d)?,
            reads: f.ic("tierstack_device_reads_total", "Read requests completed by the device (IOPS = rate)", &d)?,
            writes: f.ic("tierstack_device_writes_total", "Write requests completed by the device (IOPS = rate)", &d)?,
        })
    }

    /// Sets the counters of the devices `majmins` (MAJ:MIN).
    pub fn update<'a>(&self, majmins: impl IntoIterator<Item = &'a String>) {
        for mm in majmins {
            let Some(c) = dev_counters(mm) else {
                continue;
            };
            let name = dev_name(mm);
            let l = [name.as_str()];
            set_counter(&self.read_bytes, &l, c.read_bytes);
            set_counter(&self.write_bytes, &l, c.write_bytes);
            set_counter(&self.reads, &l, c.reads);
            set_counter(&self.writes, &l, c.writes);
        }
    }

    /// Forgets every device (the next [`Devices::update`] sets those still in use).
    pub fn clear(&self) {
        for c in [
            &self.read_bytes,
            &self.write_bytes,
            &self.reads,
            &self.writes,
        ] {
            c.reset();
        }
    }
}

/// Whether an open file of the daemon is a drive of its fast tier: not its log in the
/// runtime folder, not the namespace journal (SQLite: .db, -wal, -shm).
fn is_drive(p: &Path, run_dir: &Path) -> bool {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    !p.starts_with(run_dir)
        && !name.ends_with(".db")
        && !name.ends_with(".db-wal")
        && !name.ends_with(".db-shm")
        && !name.ends_with(".log")
}

/// The families of mounts' metrics, shared by `mount --metrics` (one mount, from its daemon)
/// and `tierstack exporter` (every mount of the node): [`MountMetrics::fill`] sets every
/// figure of one mount from its status and its daemon's /proc, under [`MOUNT_LABELS`].
pub struct MountMetrics {
    tier_capacity: IntGaugeVec,
    tier_used: IntGaugeVec,
    tier_dirty: IntGaugeVec,
    backlog_bytes: IntGaugeVec,
    backlog_files: IntGaugeVec,
    pending_ops: IntGaugeVec,
    drains_in_flight: IntGaugeVec,
    drained: IntCounterVec,
    drain_rate: GaugeVec,
    drain_retries: IntCounterVec,
    stuck: IntGaugeVec,
    backpressure: IntGaugeVec,
    degraded: IntGaugeVec,
    held: IntGaugeVec,
    limit: IntGaugeVec,
    up: IntGaugeVec,
    ops: IntCounterVec,
    op_time: Buckets,
    op_max: GaugeVec,
    control: HistogramVec,
    probe: HistogramVec,
    drive_alloc: IntGaugeVec,
    proc_read: IntCounterVec,
    proc_write: IntCounterVec,
}

impl MountMetrics {
    /// Registers the mounts' families in `reg`.
    pub fn new(reg: &Registry) -> Result<MountMetrics> {
        let f = Families(reg);
        let m = MOUNT_LABELS;
        let mt = with(&m, "tier");
        let mo = with(&m, "op");
        Ok(MountMetrics {
            tier_capacity: f.ig("tierstack_tier_capacity_bytes", "Capacity of a tier of the mount's store", &mt)?,
            tier_used: f.ig("tierstack_tier_used_bytes", "Bytes held in a tier of the mount's store", &mt)?,
            tier_dirty: f.ig("tierstack_tier_dirty_bytes", "Bytes in a tier not yet written to the next one", &mt)?,
            backlog_bytes: f.ig("tierstack_drain_backlog_bytes", "Bytes written to the mount and not yet drained to the backing directory", &m)?,
            backlog_files: f.ig("tierstack_drain_backlog_files", "Files with data not yet drained", &m)?,
            pending_ops: f.ig("tierstack_journal_pending_ops", "Namespace journal operations not yet replayed to the backing directory", &m)?,
            drains_in_flight: f.ig("tierstack_drains_in_flight", "Files being drained now", &m)?,
            drained: f.ic("tierstack_drained_bytes_total", "Bytes drained to the backing directory since the mount", &m)?,
            drain_rate: f.fg("tierstack_drain_rate_bytes_per_second", "The drainer's recent rate", &m)?,
            drain_retries: f.ic("tierstack_drain_retries_total", "Drain attempts retried after an error", &m)?,
            stuck: f.ig("tierstack_stuck_records", "Journal records the backing directory refused for good (quarantined)", &m)?,
            backpressure: f.ig("tierstack_backpressure", "1 while writers wait for room in the fast tier", &m)?,
            degraded: f.ig("tierstack_array_degraded", "1 while the fast tier's array is not online (degraded, rebuilding or failed)", &m)?,
            held: f.ig("tierstack_held_bytes", "Bytes the fast tier holds for the mount", &m)?,
            limit: f.ig("tierstack_held_limit_bytes", "Bytes the fast tier may hold before writers wait", &m)?,
            up: f.ig("tierstack_mount_up", "1 when the mount's control socket answered this scrape", &m)?,
            ops: f.ic("tierstack_fuse_ops_total", "FUSE operations served since the mount", &mo)?,
            op_time: Buckets::register(reg, "tierstack_fuse_op_duration_seconds", "Time the daemon took to serve a FUSE operation, since the mount", &mo)?,
            op_max: f.fg("tierstack_fuse_op_latency_max_seconds", "Longest FUSE operation since the mount", &mo)?,
            control: f.hist("tierstack_control_request_duration_seconds", "Round trip of a status request on the mount's control socket", &m)?,
            probe: f.hist("tierstack_mount_probe_duration_seconds", "statfs(2) through the mount, once a second: how quickly the mount answers a client", &m)?,
            drive_alloc: f.ig("tierstack_drive_allocated_bytes", "Disk space a drive file of the fast tier takes", &with(&m, "drive"))?,
            proc_read: f.ic("tierstack_process_read_bytes_total", "Bytes the daemon read from block devices (/proc/PID/io read_bytes)", &m)?,
            proc_write: f.ic("tierstack_process_written_bytes_total", "Bytes the daemon wrote to block devices (/proc/PID/io write_bytes)", &m)?,
        })
    }

    /// Starts a thread that probes the mount at `mp` with statfs(2) once a second while
    /// `alive` holds, into the probe histogram of the mount labelled `l` (a probe that hangs
    /// holds up its own thread only, never a scrape).
    pub fn start_probe(&self, l: &[&str; 3], mp: &Path, alive: Arc<AtomicBool>) -> Result<()> {
        // A handle on the series: once the mount is forgotten it is no longer exported.
        let h = self.probe.with_label_values(l);
        let mp = mp.to_path_buf();
        std::thread::Builder::new()
            .name("metrics-probe".into())
            .spawn(move || {
                while alive.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    if rustix::fs::statfs(&mp).is_ok() {
                        h.observe(t0.elapsed().as_secs_f64());
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
            .map_err(|source| NodeError::Io {
                what: "cannot start the metrics probe thread".into(),
                source,
            })?;
        Ok(())
    }

    /// Says whether the mount labelled `l` answered this scrape; the round trip of its
    /// status request when it did.
    pub fn answered(&self, l: &[&str; 3], round_trip: Option<Duration>) {
        self.up
            .with_label_values(l)
            .set(i64::from(round_trip.is_some()));
        if let Some(t) = round_trip {
            self.control.with_label_values(l).observe(t.as_secs_f64());
        }
    }

    /// Sets every figure of the mount labelled `l` from its status `s`, its daemon's
    /// `/proc/PID/io` and the drives it holds open (whose devices go to `devices`).
    pub fn fill(&self, l: &[&str; 3], s: &MountStatus, devices: &Devices) {
        for t in &s.tiers {
            let lt = with(l, t.name.as_str());
            self.tier_capacity
                .with_label_values(&lt)
                .set(t.capacity_bytes as i64);
            self.tier_used
                .with_label_values(&lt)
                .set(t.used_bytes as i64);
            self.tier_dirty
                .with_label_values(&lt)
                .set(t.dirty_bytes as i64);
        }
        let d = &s.drain;
        self.backlog_bytes
            .with_label_values(l)
            .set(d.dirty_bytes as i64);
        self.backlog_files
            .with_label_values(l)
            .set(d.dirty_files as i64);
        self.pending_ops
            .with_label_values(l)
            .set(d.pending_ops as i64);
        self.drains_in_flight
            .with_label_values(l)
            .set(d.drains_in_flight as i64);
        set_counter(&self.drained, l, d.drained_bytes);
        self.drain_rate
            .with_label_values(l)
            .set(d.drain_bytes_per_s);
        set_counter(&self.drain_retries, l, s.drain_retries);
        self.stuck.with_label_values(l).set(s.stuck.len() as i64);
        self.backpressure
            .with_label_values(l)
            .set(i64::from(s.backpressure));
        self.degraded.with_label_values(l).set(i64::from(
            !s.array_state.is_empty() && s.array_state != "online",
        ));
        self.held.with_label_values(l).set(s.held_bytes as i64);
        self.limit.with_label_values(l).set(s.limit_bytes as i64);
        for o in &s.ops {
            let lo = with(l, o.op.as_str());
            set_counter(&self.ops, &lo, o.count);
            self.op_time
                .set(&lo, &o.buckets, o.mean_us * o.count as f64 / 1e6);
            self.op_max
                .with_label_values(&lo)
                .set(o.max_us as f64 / 1e6);
        }
        if let Some(io) = proc_io(s.pid) {
            set_counter(&self.proc_read, l, io.read_bytes);
            set_counter(&self.proc_write, l, io.write_bytes);
        }
        // The daemon names its drives; one from before it did is looked at through /proc.
        let files: Vec<(PathBuf, String)> = if s.drive_paths.is_empty() {
            let rd = tierstack_fs::mount::run_dir();
            open_files(s.pid, None)
                .into_iter()
                .filter(|(p, _)| !p.starts_with(&s.mountpoint) && !p.starts_with(&s.backing))
                .filter(|(p, _)| is_drive(p, &rd))
                .collect()
        } else {
            s.drive_paths
                .iter()
                .filter_map(|p| {
                    use std::os::unix::fs::MetadataExt;
                    let dev = std::fs::metadata(p).ok()?.dev();
                    let majmin = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
                    Some((p.clone(), majmin))
                })
                .collect()
        };
        for (p, _) in &files {
            if let Ok(md) = std::fs::metadata(p) {
                use std::os::unix::fs::MetadataExt;
                let name = p.display().to_string();
                self.drive_alloc
                    .with_label_values(&with(l, name.as_str()))
                    .set((md.blocks() * 512) as i64);
            }
        }
        devices.update(files.iter().map(|(_, d)| d));
    }

    /// Forgets every figure set from a status (the next [`MountMetrics::fill`]s set those of
    /// the mounts still there). The histograms measured here are kept: see
    /// [`MountMetrics::forget`].
    pub fn clear(&self) {
        for g in [
            &self.tier_capacity,
            &self.tier_used,
            &self.tier_dirty,
            &self.backlog_bytes,
            &self.backlog_files,
            &self.pending_ops,
            &self.drains_in_flight,
            &self.stuck,
            &self.backpressure,
            &self.degraded,
            &self.held,
            &self.limit,
            &self.up,
            &self.drive_alloc,
        ] {
            g.reset();
        }
        for c in [
            &self.drained,
            &self.drain_retries,
            &self.ops,
            &self.proc_read,
            &self.proc_write,
        ] {
            c.reset();
        }
        self.drain_rate.reset();
        self.op_max.reset();
        self.op_time.clear();
    }

    /// Drops the measured histograms of a mount that went away.
    pub fn forget(&self, l: &[&str; 3]) {
        let _ = self.control.remove_label_values(l);
        let _ = self.probe.remove_label_values(l);
    }
}

/// The labels of a mount: its mount point and its [`Owner`].
pub fn mount_label_values(mountpoint: &Path, o: &Owner) -> [String; 3] {
    [
        mountpoint.display().to_string(),
        o.job.clone(),
        o.user.clone(),
    ]
}

/// `[String; 3]` as `[&str; 3]`.
pub fn label_refs(l: &[String; 3]) -> [&str; 3] {
    [l[0].as_str(), l[1].as_str(), l[2].as_str()]
}

/// Serves a mount's metrics from its daemon (called before the mount starts, so a port in
/// use stops the daemon with a clear error). The labels are the mount point's and, once the
/// daemon answers, its owner's; the statfs probe starts then.
pub fn serve_mount(addr: &str, mp: &Path) -> Result<()> {
    let listener = bind(addr)?;
    let reg = Registry::new();
    let m = MountMetrics::new(&reg)?;
    let devices = Devices::new(&reg)?;
    let mp = mp.to_path_buf();
    let mut labels: Option<[String; 3]> = None;
    serve(listener, reg, move || {
        let t0 = Instant::now();
        let Ok(s) = tierstack_fs::mount::status(&mp) else {
            let l = labels
                .clone()
                .unwrap_or_else(|| mount_label_values(&mp, &Owner::default()));
            m.answered(&label_refs(&l), None);
            return;
        };
        let rtt = t0.elapsed();
        let l = labels.get_or_insert_with(|| {
            let sock = tierstack_fs::mount::socket_path(&mp);
            let l = mount_label_values(&mp, &mount_owner(&s, &sock));
            // Series under the provisional labels of a daemon that did not answer yet.
            m.clear();
            m.forget(&label_refs(&mount_label_values(&mp, &Owner::default())));
            if let Err(e) = m.start_probe(&label_refs(&l), &mp, Arc::new(AtomicBool::new(true))) {
                tracing::warn!("{e}");
            }
            l
        });
        let l = label_refs(l);
        m.answered(&l, Some(rtt));
        m.fill(&l, &s, &devices);
    })
}

/// The families of runs' metrics, shared by `run --metrics` (one run, from its `tierstack
/// run` process) and `tierstack exporter` (every run of the node), under [`RUN_LABELS`].
pub struct RunMetrics {
    budget: IntGaugeVec,
    page: IntGaugeVec,
    rss: IntGaugeVec,
    up: IntGaugeVec,
    read: IntCounterVec,
    write: IntCounterVec,
    exited: IntCounterVec,
    paging: IntGaugeVec,
    faults: IntCounterVec,
    paged_in: IntCounterVec,
    paged_out: IntCounterVec,
    evictions: IntCounterVec,
    resident: IntGaugeVec,
    fault_time: Buckets,
}

impl RunMetrics {
    /// Registers the runs' families in `reg`.
    pub fn new(reg: &Registry) -> Result<RunMetrics> {
        let f = Families(reg);
        let l = RUN_LABELS;
        Ok(RunMetrics {
            budget: f.ig(
                "tierstack_run_dram_budget_bytes",
                "The run's --dram budget per process",
                &l,
            )?,
            page: f.ig("tierstack_run_page_bytes", "The run's page size", &l)?,
            rss: f.ig(
                "tierstack_run_resident_bytes",
                "Resident memory of the program's main process (VmRSS)",
                &l,
            )?,
            up: f.ig("tierstack_run_up", "1 while the program runs", &l)?,
            read: f.ic(
                "tierstack_run_read_bytes_total",
                "Bytes the program read from block devices (paging in, and its own reads)",
                &l,
            )?,
            write: f.ic(
                "tierstack_run_written_bytes_total",
                "Bytes the program wrote to block devices (paging out, and its own writes)",
                &l,
            )?,
            exited: f.ic(
                "tierstack_run_exited_processes_total",
                "Paged processes of the program that exited",
                &l,
            )?,
            paging: f.ig(
                "tierstack_run_paging_processes",
                "Processes of the program paging now (each reports about once a second)",
                &l,
            )?,
            faults: f.ic(
                "tierstack_run_faults_total",
                "Page faults served by tierstack (live and exited processes)",
                &l,
            )?,
            paged_in: f.ic(
                "tierstack_run_paged_in_bytes_total",
                "Bytes paged in from the store",
                &l,
            )?,
            paged_out: f.ic(
                "tierstack_run_paged_out_bytes_total",
                "Bytes paged out to the store",
                &l,
            )?,
            evictions: f.ic("tierstack_run_evictions_total", "Pages evicted", &l)?,
            resident: f.ig(
                "tierstack_run_paged_resident_bytes",
                "Bytes of paged memory resident now (processes paging now)",
                &l,
            )?,
            fault_time: Buckets::register(
                reg,
                "tierstack_run_fault_duration_seconds",
                "Time from a fault served from the store to the program's wake-up",
                &l,
            )?,
        })
    }

    /// Sets every figure of the run `rec` labelled `l` from /proc and its run folder (the
    /// devices of its drives go to `devices`).
    pub fn fill(&self, l: &[&str; 3], rec: &RunRecord, devices: &Devices) {
        self.budget.with_label_values(l).set(rec.dram_bytes as i64);
        self.page.with_label_values(l).set(rec.page_bytes as i64);
        let alive = tierstack_common::process::alive(rec.pid);
        self.up.with_label_values(l).set(i64::from(alive));
        if let Some(r) = rss_bytes(rec.pid) {
            self.rss.with_label_values(l).set(r as i64);
        }
        if let Some(io) = proc_io(rec.pid) {
            set_counter(&self.read, l, io.read_bytes);
            set_counter(&self.write, l, io.write_bytes);
        }
        let c = run_counters(&rec.stats_dir);
        set_counter(&self.exited, l, c.exited);
        self.paging.with_label_values(l).set(c.live as i64);
        set_counter(&self.faults, l, c.get("faults"));
        set_counter(&self.paged_in, l, c.get("bytes_in"));
        set_counter(&self.paged_out, l, c.get("bytes_out"));
        set_counter(&self.evictions, l, c.get("evictions"));
        self.resident
            .with_label_values(l)
            .set(c.live_resident as i64);
        self.fault_time
            .set(l, &c.fault_buckets, c.get("store_fault_ns") as f64 / 1e9);
        let files = open_files(rec.pid, Some(&rec.stats_dir));
        devices.update(files.iter().map(|(_, d)| d));
    }

    /// Forgets every run (the next [`RunMetrics::fill`]s set those still running).
    pub fn clear(&self) {
        for g in [
            &self.budget,
            &self.page,
            &self.rss,
            &self.up,
            &self.paging,
            &self.resident,
        ] {
            g.reset();
        }
        for c in [
            &self.read,
            &self.write,
            &self.exited,
            &self.faults,
            &self.paged_in,
            &self.paged_out,
            &self.evictions,
        ] {
            c.reset();
        }
        self.fault_time.clear();
    }
}

/// The labels of a run: its program's pid and its [`Owner`].
pub fn run_label_values(rec: &RunRecord, o: &Owner) -> [String; 3] {
    [rec.pid.to_string(), o.job.clone(), o.user.clone()]
}

/// The metrics of a `tierstack run`, served from the `tierstack run` process.
pub fn serve_run(listener: TcpListener, rec: RunRecord) -> Result<()> {
    let reg = Registry::new();
    let m = RunMetrics::new(&reg)?;
    let devices = Devices::new(&reg)?;
    let l = run_label_values(&rec, &run_owner(&rec));
    serve(listener, reg, move || {
        m.fill(&label_refs(&l), &rec, &devices)
    })
}
