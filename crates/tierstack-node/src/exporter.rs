//! `tierstack exporter`: one Prometheus endpoint for every mount and `tierstack run` of the
//! node, found as `top` finds them (the control sockets and run records of the runtime
//! folder, [`crate::top::mount_sockets`] and [`crate::runs::read_runs`]).
//!
//! The series are those of `mount --metrics` and `run --metrics` ([`MountMetrics`],
//! [`RunMetrics`]: the same families, help texts and code), each labelled with its mount
//! point (a run: its pid), SLURM job and user ([`crate::labels`]), so one dashboard
//! (`contrib/grafana/tierstack.json`) serves both. Per-process figures come from the
//! daemon's or program's own `/proc/PID`.
//!
//! At each scrape every family set from a status is emptied and filled again from the
//! mounts and runs there now, so a mount that went away leaves the output at once; the
//! histograms measured here (the status round trip, the statfs probe, a thread per mount)
//! keep their counts while the mount stays and are dropped when it goes. A registry built
//! afresh at each scrape would lose them; emptying the families costs less than building
//! one (see `fill_cost` in the unit tests). A control socket that stops answering keeps its
//! mount's series with `tierstack_mount_up` 0 until it answers again or goes.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prometheus::{Gauge, IntGauge, Opts, Registry};

use crate::labels::{mount_owner, run_owner};
use crate::metrics::{
    label_refs, mount_label_values, run_label_values, serve, Devices, MountMetrics, RunMetrics,
};
use crate::runs::read_runs;
use crate::top::mount_sockets;
use crate::Result;

/// Where `tierstack exporter` listens by default: every interface (Prometheus scrapes from
/// another host), port 9469 — not node_exporter's 9100, dcgm-exporter's 9400, nor 9464 of
/// the `--metrics` examples (also OpenTelemetry's exporter), so it runs beside all three.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9469";

/// Binds the exporter's `--listen ADDR:PORT` (a bad or busy address is a usage error).
pub fn bind(addr: &str) -> Result<TcpListener> {
    crate::metrics::bind_flag("listen", addr, "0.0.0.0:9470")
}

/// A mount seen at the last scrape.
struct Known {
    labels: [String; 3],
    socket: PathBuf,
    /// Keeps its statfs probe thread going.
    alive: Arc<AtomicBool>,
}

/// What one scrape found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scrape {
    /// Mounts that answered.
    pub mounts: usize,
    /// Live runs.
    pub runs: usize,
    /// Control sockets that did not answer.
    pub silent: usize,
    /// Seconds the scrape took to gather every figure (before encoding).
    pub seconds: f64,
}

/// The node-wide exporter's registry and what it remembers between scrapes.
pub struct NodeExporter {
    reg: Registry,
    mounts: MountMetrics,
    runs: RunMetrics,
    devices: Devices,
    n_mounts: IntGauge,
    n_runs: IntGauge,
    n_silent: IntGauge,
    duration: Gauge,
    known: BTreeMap<(PathBuf, u32), Known>,
    run_labels: HashMap<(u32, u32), [String; 3]>,
    /// Whether to start a statfs probe thread per mount (unit tests do without).
    probes: bool,
}

impl NodeExporter {
    /// A registry with every family of mounts, runs and devices and the exporter's own.
    pub fn new() -> Result<NodeExporter> {
        let reg = Registry::new();
        let ig = |n: &str, h: &str| -> Result<IntGauge> {
            let g = IntGauge::with_opts(Opts::new(n, h))?;
            reg.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let n_mounts = ig(
            "tierstack_exporter_mounts",
            "Mounts whose control socket answered this scrape",
        )?;
        let n_runs = ig(
            "tierstack_exporter_runs",
            "Live `tierstack run`s this scrape",
        )?;
        let n_silent = ig(
            "tierstack_exporter_silent_sockets",
            "Control sockets in the runtime folder that did not answer this scrape",
        )?;
        let duration = Gauge::with_opts(Opts::new(
            "tierstack_exporter_scrape_duration_seconds",
            "Time this scrape took to gather the figures of every mount and run",
        ))?;
        reg.register(Box::new(duration.clone()))?;
        Ok(NodeExporter {
            mounts: MountMetrics::new(&reg)?,
            runs: RunMetrics::new(&reg)?,
            devices: Devices::new(&reg)?,
            reg,
            n_mounts,
            n_runs,
            n_silent,
            duration,
            known: BTreeMap::new(),
            run_labels: HashMap::new(),
            probes: true,
        })
    }

    /// The registry the scrape encodes.
    pub fn registry(&self) -> &Registry {
        &self.reg
    }

    /// Without the statfs probe threads (tests).
    pub fn without_probes(mut self) -> NodeExporter {
        self.probes = false;
        self
    }

    /// Sets every figure from the mounts and runs there now.
    pub fn refresh(&mut self) -> Scrape {
        let t0 = Instant::now();
        let (found, silent) = mount_sockets();
        self.mounts.clear();
        self.runs.clear();
        self.devices.clear();
        // Mounts gone first (a mount made again at the same place gets the same labels).
        let mut seen: BTreeSet<(PathBuf, u32)> = found
            .iter()
            .map(|f| (f.status.mountpoint.clone(), f.status.pid))
            .collect();
        // A known mount whose socket is there but silent: up 0, its series kept.
        for (key, k) in &self.known {
            if !seen.contains(key) && silent.contains(&k.socket) {
                self.mounts.answered(&label_refs(&k.labels), None);
                seen.insert(key.clone());
            }
        }
        let mounts = &self.mounts;
        self.known.retain(|key, k| {
            let keep = seen.contains(key);
            if !keep {
                k.alive.store(false, Ordering::Relaxed);
                mounts.forget(&label_refs(&k.labels));
            }
            keep
        });
        for f in &found {
            let st = &f.status;
            let k = match self.known.entry((st.mountpoint.clone(), st.pid)) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    let labels = mount_label_values(&st.mountpoint, &mount_owner(st, &f.socket));
                    let alive = Arc::new(AtomicBool::new(true));
                    if self.probes {
                        let l = label_refs(&labels);
                        if let Err(e) = self.mounts.start_probe(&l, &st.mountpoint, alive.clone()) {
                            tracing::warn!("{}: {e}", st.mountpoint.display());
                        }
                    }
                    v.insert(Known {
                        labels,
                        socket: f.socket.clone(),
                        alive,
                    })
                }
            };
            let l = label_refs(&k.labels);
            self.mounts.answered(&l, Some(f.round_trip));
            self.mounts.fill(&l, st, &self.devices);
        }
        let runs = read_runs();
        self.run_labels
            .retain(|(tp, p), _| runs.iter().any(|r| r.tierstack_pid == *tp && r.pid == *p));
        for rec in &runs {
            let l = self
                .run_labels
                .entry((rec.tierstack_pid, rec.pid))
                .or_insert_with(|| run_label_values(rec, &run_owner(rec)));
            self.runs.fill(&label_refs(l), rec, &self.devices);
        }
        let s = Scrape {
            mounts: found.len(),
            runs: runs.len(),
            silent: silent.len(),
            seconds: t0.elapsed().as_secs_f64(),
        };
        self.n_mounts.set(s.mounts as i64);
        self.n_runs.set(s.runs as i64);
        self.n_silent.set(s.silent as i64);
        self.duration.set(s.seconds);
        s
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        for k in self.known.values() {
            k.alive.store(false, Ordering::Relaxed);
        }
    }
}

/// Serves every mount's and run's metrics on `listener` in a thread (one scrape at a time);
/// returns what a first look found.
pub fn serve_node(listener: TcpListener) -> Result<Scrape> {
    let mut exp = NodeExporter::new()?;
    let first = exp.refresh();
    let reg = exp.registry().clone();
    serve(listener, reg, move || {
        exp.refresh();
    })?;
    Ok(first)
}
