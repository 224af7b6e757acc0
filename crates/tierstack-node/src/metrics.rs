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
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::sync::Mutex;

use crate::probe::{dev_counters, dev_name, open_files, proc_io, rss_bytes};
use crate::runs::{run_counters, RunRecord};

/// Parses ADDR:PORT and binds it, with a one-line error naming the fix.
pub fn bind(addr: &str) -> Result<TcpListener> {
    let sa: SocketAddr = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| {
            NodeError::Usage(format!(
                "--metrics {addr} is not an address: give ADDR:PORT, e.g. 127.0.0.1:9464"
            ))
        })?;
    TcpListener::bind(sa).map_err(|e| {
        NodeError::Usage(format!(
            "--metrics {addr}: cannot listen there ({e}): pick a free port, e.g. 127.0.0.1:9464"
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
            m.set_label(
                self.0
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(n, v)| {
                        let mut l = proto::LabelPair::default();
                        l.set_name(n.clone());
                        l.set_value(v.clone());
                        l
                    })
                    .collect(),
            );
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

struct Proc {
    read: IntCounterVec,
    write: IntCounterVec,
}

struct Devices {
    read_bytes: IntCounterVec,
    write_bytes: IntCounterVec,
    reads: IntCounterVec,
    writes: IntCounterVec,
}

impl Devices {
    fn new(reg: &Registry) -> Result<Devices> {
        let mk = |n: &str, h: &str| -> Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(n, h), &["device"]).map_err(reg_err)?;
            reg.register(Box::new(c.clone())).map_err(reg_err)?;
            Ok(c)
        };
        Ok(Devices {
            read_bytes: mk("tierstack_device_read_bytes_total", "Bytes read from a block device that holds drives of this process (whole device, as iostat)")?,
            write_bytes: mk("tierstack_device_written_bytes_total", "Bytes written to a block device that holds drives of this process (whole device, as iostat)")?,
            reads: mk("tierstack_device_reads_total", "Read requests completed by the device (IOPS = rate)")?,
            writes: mk("tierstack_device_writes_total", "Write requests completed by the device (IOPS = rate)")?,
        })
    }

    fn update(&self, majmins: &std::collections::BTreeSet<String>) {
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

/// The metrics of one mount, served from its daemon.
pub struct MountMetrics {
    mp: PathBuf,
    mpl: String,
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
    proc_io: Proc,
    devices: Devices,
}

impl MountMetrics {
    /// Registers the mount's metrics for the mount at `mp` in `reg`.
    pub fn new(reg: &Registry, mp: &Path) -> Result<MountMetrics> {
        let ig = |n: &str, h: &str, l: &[&str]| -> Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(n, h), l).map_err(reg_err)?;
            reg.register(Box::new(g.clone())).map_err(reg_err)?;
            Ok(g)
        };
        let fg = |n: &str, h: &str, l: &[&str]| -> Result<GaugeVec> {
            let g = GaugeVec::new(Opts::new(n, h), l).map_err(reg_err)?;
            reg.register(Box::new(g.clone())).map_err(reg_err)?;
            Ok(g)
        };
        let ic = |n: &str, h: &str, l: &[&str]| -> Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(n, h), l).map_err(reg_err)?;
            reg.register(Box::new(c.clone())).map_err(reg_err)?;
            Ok(c)
        };
        let hist = |n: &str, h: &str| -> Result<HistogramVec> {
            let x = HistogramVec::new(
                HistogramOpts::new(n, h).buckets(latency_buckets()),
                &["mountpoint"],
            )
            .map_err(reg_err)?;
            reg.register(Box::new(x.clone())).map_err(reg_err)?;
            Ok(x)
        };
        let m = ["mountpoint"];
        let mt = ["mountpoint", "tier"];
        let mo = ["mountpoint", "op"];
        Ok(MountMetrics {
            mp: mp.to_path_buf(),
            mpl: mp.display().to_string(),
            tier_capacity: ig("tierstack_tier_capacity_bytes", "Capacity of a tier of the mount's store", &mt)?,
            tier_used: ig("tierstack_tier_used_bytes", "Bytes held in a tier of the mount's store", &mt)?,
            tier_dirty: ig("tierstack_tier_dirty_bytes", "Bytes in a tier not yet written to the next one", &mt)?,
            backlog_bytes: ig("tierstack_drain_backlog_bytes", "Bytes written to the mount and not yet drained to the backing directory", &m)?,
            backlog_files: ig("tierstack_drain_backlog_files", "Files with data not yet drained", &m)?,
            pending_ops: ig("tierstack_journal_pending_ops", "Namespace journal operations not yet replayed to the backing directory", &m)?,
            drains_in_flight: ig("tierstack_drains_in_flight", "Files being drained now", &m)?,
            drained: ic("tierstack_drained_bytes_total", "Bytes drained to the backing directory since the mount", &m)?,
            drain_rate: fg("tierstack_drain_rate_bytes_per_second", "The drainer's recent rate", &m)?,
            drain_retries: ic("tierstack_drain_retries_total", "Drain attempts retried after an error", &m)?,
            stuck: ig("tierstack_stuck_records", "Journal records the backing directory refused for good (quarantined)", &m)?,
            backpressure: ig("tierstack_backpressure", "1 while writers wait for room in the fast tier", &m)?,
            degraded: ig("tierstack_array_degraded", "1 while the fast tier's array is not online (degraded, rebuilding or failed)", &m)?,
            held: ig("tierstack_held_bytes", "Bytes the fast tier holds for the mount", &m)?,
            limit: ig("tierstack_held_limit_bytes", "Bytes the fast tier may hold before writers wait", &m)?,
            up: ig("tierstack_mount_up", "1 when the mount's control socket answered this scrape", &m)?,
            ops: ic("tierstack_fuse_ops_total", "FUSE operations served since the mount", &mo)?,
            op_time: Buckets::register(reg, "tierstack_fuse_op_duration_seconds", "Time the daemon took to serve a FUSE operation, since the mount", &mo)?,
            op_max: fg("tierstack_fuse_op_latency_max_seconds", "Longest FUSE operation since the mount", &mo)?,
            control: hist("tierstack_control_request_duration_seconds", "Round trip of a status request on the mount's control socket")?,
            probe: hist("tierstack_mount_probe_duration_seconds", "statfs(2) through the mount, once a second: how quickly the mount answers a client")?,
            drive_alloc: ig("tierstack_drive_allocated_bytes", "Disk space a drive file of the fast tier takes", &["mountpoint", "drive"])?,
            proc_io: Proc {
                read: ic("tierstack_process_read_bytes_total", "Bytes the daemon read from block devices (/proc/self/io read_bytes)", &m)?,
                write: ic("tierstack_process_written_bytes_total", "Bytes the daemon wrote to block devices (/proc/self/io write_bytes)", &m)?,
            },
            devices: Devices::new(reg)?,
        })
    }

    /// Starts the statfs probe thread (one probe a second, for the life of the process).
    pub fn start_probe(&self) -> Result<()> {
        let h = self.probe.with_label_values(&[self.mpl.as_str()]);
        let mp = self.mp.clone();
        std::thread::Builder::new()
            .name("metrics-probe".into())
            .spawn(move || loop {
                let t0 = Instant::now();
                if rustix::fs::statfs(&mp).is_ok() {
                    h.observe(t0.elapsed().as_secs_f64());
                }
                std::thread::sleep(Duration::from_secs(1));
            })
            .map_err(|source| NodeError::Io {
                what: "cannot start the metrics probe thread".into(),
                source,
            })?;
        Ok(())
    }

    /// Updates every figure from the mount's control socket, /proc and the drives' devices.
    pub fn refresh(&self) {
        let l = [self.mpl.as_str()];
        let t0 = Instant::now();
        let st = tierstack_fs::mount::status(&self.mp);
        let Ok(s) = st else {
            self.up.with_label_values(&l).set(0);
            return;
        };
        self.control
            .with_label_values(&l)
            .observe(t0.elapsed().as_secs_f64());
        self.up.with_label_values(&l).set(1);
        for t in &s.tiers {
            let lt = [self.mpl.as_str(), t.name.as_str()];
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
        self.backlog_bytes
            .with_label_values(&l)
            .set(s.drain.dirty_bytes as i64);
        self.backlog_files
            .with_label_values(&l)
            .set(s.drain.dirty_files as i64);
        self.pending_ops
            .with_label_values(&l)
            .set(s.drain.pending_ops as i64);
        self.drains_in_flight
            .with_label_values(&l)
            .set(s.drain.drains_in_flight as i64);
        set_counter(&self.drained, &l, s.drain.drained_bytes);
        self.drain_rate
            .with_label_values(&l)
            .set(s.drain.drain_bytes_per_s);
        set_counter(&self.drain_retries, &l, s.drain_retries);
        self.stuck.with_label_values(&l).set(s.stuck.len() as i64);
        self.backpressure
            .with_label_values(&l)
            .set(i64::from(s.backpressure));
        self.degraded.with_label_values(&l).set(i64::from(
            !s.array_state.is_empty() && s.array_state != "online",
        ));
        self.held.with_label_values(&l).set(s.held_bytes as i64);
        self.limit.with_label_values(&l).set(s.limit_bytes as i64);
        for o in &s.ops {
            let lo = [self.mpl.as_str(), o.op.as_str()];
            set_counter(&self.ops, &lo, o.count);
            self.op_time
                .set(&lo, &o.buckets, o.mean_us * o.count as f64 / 1e6);
            self.op_max
                .with_label_values(&lo)
                .set(o.max_us as f64 / 1e6);
        }
        if let Some(io) = proc_io(std::process::id()) {
            set_counter(&self.proc_io.read, &l, io.read_bytes);
            set_counter(&self.proc_io.write, &l, io.write_bytes);
        }
        let files: Vec<(PathBuf, String)> = open_files(std::process::id(), None)
            .into_iter()
            .filter(|(p, _)| !p.starts_with(&s.mountpoint) && !p.starts_with(&s.backing))
            .collect();
        let rd = tierstack_fs::mount::run_dir();
        for (p, _) in files.iter().filter(|(p, _)| is_drive(p, &rd)) {
            if let Ok(md) = std::fs::metadata(p) {
                use std::os::unix::fs::MetadataExt;
                let name = p.display().to_string();
                self.drive_alloc
                    .with_label_values(&[self.mpl.as_str(), name.as_str()])
                    .set((md.blocks() * 512) as i64);
            }
        }
        self.devices
            .update(&files.into_iter().map(|(_, d)| d).collect());
    }
}

/// Serves a mount's metrics from its daemon (called before the mount starts, so a port in
/// use stops the daemon with a clear error).
pub fn serve_mount(addr: &str, mp: &Path) -> Result<()> {
    let listener = bind(addr)?;
    let reg = Registry::new();
    let m = MountMetrics::new(&reg, mp)?;
    m.start_probe()?;
    serve(listener, reg, move || m.refresh())
}

/// The metrics of a `tierstack run`, served from the `tierstack run` process.
pub fn serve_run(listener: TcpListener, rec: RunRecord) -> Result<()> {
    let reg = Registry::new();
    let l = ["pid"];
    let ig = |n: &str, h: &str| -> Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(n, h), &l).map_err(reg_err)?;
        reg.register(Box::new(g.clone())).map_err(reg_err)?;
        Ok(g)
    };
    let ic = |n: &str, h: &str| -> Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(n, h), &l).map_err(reg_err)?;
        reg.register(Box::new(c.clone())).map_err(reg_err)?;
        Ok(c)
    };
    let budget = ig(
        "tierstack_run_dram_budget_bytes",
        "The run's --dram budget per process",
    )?;
    let page = ig("tierstack_run_page_bytes", "The run's page size")?;
    let rss = ig(
        "tierstack_run_resident_bytes",
        "Resident memory of the program's main process (VmRSS)",
    )?;
    let up = ig("tierstack_run_up", "1 while the program runs")?;
    let read = ic(
        "tierstack_run_read_bytes_total",
        "Bytes the program read from block devices (paging in, and its own reads)",
    )?;
    let write = ic(
        "tierstack_run_written_bytes_total",
        "Bytes the program wrote to block devices (paging out, and its own writes)",
    )?;
    let exited = ic(
        "tierstack_run_exited_processes_total",
        "Paged processes of the program that exited",
    )?;
    let paging = ig(
        "tierstack_run_paging_processes",
        "Processes of the program paging now (each reports about once a second)",
    )?;
    let faults = ic(
        "tierstack_run_faults_total",
        "Page faults served by tierstack (live and exited processes)",
    )?;
    let paged_in = ic(
        "tierstack_run_paged_in_bytes_total",
        "Bytes paged in from the store",
    )?;
    let paged_out = ic(
        "tierstack_run_paged_out_bytes_total",
        "Bytes paged out to the store",
    )?;
    let evictions = ic("tierstack_run_evictions_total", "Pages evicted")?;
    let resident = ig(
        "tierstack_run_paged_resident_bytes",
        "Bytes of paged memory resident now (processes paging now)",
    )?;
    let fault_time = Buckets::register(
        &reg,
        "tierstack_run_fault_duration_seconds",
        "Time from a fault served from the store to the program's wake-up",
        &l,
    )?;
    let devices = Devices::new(&reg)?;
    let pid = rec.pid.to_string();
    serve(listener, reg, move || {
        let lv = [pid.as_str()];
        budget.with_label_values(&lv).set(rec.dram_bytes as i64);
        page.with_label_values(&lv).set(rec.page_bytes as i64);
        let alive = tierstack_common::process::alive(rec.pid);
        up.with_label_values(&lv).set(i64::from(alive));
        if let Some(r) = rss_bytes(rec.pid) {
            rss.with_label_values(&lv).set(r as i64);
        }
        if let Some(io) = proc_io(rec.pid) {
            set_counter(&read, &lv, io.read_bytes);
            set_counter(&write, &lv, io.write_bytes);
        }
        let c = run_counters(&rec.stats_dir);
        set_counter(&exited, &lv, c.exited);
        paging.with_label_values(&lv).set(c.live as i64);
        set_counter(&faults, &lv, c.get("faults"));
        set_counter(&paged_in, &lv, c.get("bytes_in"));
        set_counter(&paged_out, &lv, c.get("bytes_out"));
        set_counter(&evictions, &lv, c.get("evictions"));
        resident.with_label_values(&lv).set(c.live_resident as i64);
        fault_time.set(&lv, &c.fault_buckets, c.get("store_fault_ns") as f64 / 1e9);
        devices.update(
            &open_files(rec.pid, Some(&rec.stats_dir))
                .into_iter()
                .map(|(_, d)| d)
                .collect(),
        );
    })
}
