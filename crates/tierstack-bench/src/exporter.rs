//! `tierstack bench exporter`: what one scrape of the node's exporter (`tierstack exporter`)
//! costs, issue 38's measurement. It makes M real mounts (`tierstack mount`, each its own
//! fast tier, in a runtime folder of the benchmark's own so the exporter sees these mounts
//! only), writes F files of 4 KiB into each (their drains kept running by a low
//! `--drain-rate`: `status` walks the namespace under its lock, and empty or idle mounts
//! prove nothing), starts `tierstack exporter` on a free local port and scrapes it S times,
//! 200 ms apart. It reports each scrape's time over HTTP, per mount, and the exporter's own
//! gathering time (`tierstack_exporter_scrape_duration_seconds`), against the target of
//! 5 ms per mount. At the end the mounts are stopped with `umount --force` (their undrained
//! files stay in their journals) and everything the benchmark made is removed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The target: a scrape costs at most this per mount.
pub const TARGET_MS_PER_MOUNT: f64 = 5.0;

/// The drain rate of each mount (MB/s): low enough that the drains still run at the scrapes.
const DRAIN_RATE: &str = "0.5";

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ExporterBenchError {
    /// A step failed: what it was and what it said.
    #[error("bench exporter: {step} failed: {detail}")]
    Step {
        /// The step.
        step: String,
        /// What failed (a command's last lines, an I/O error).
        detail: String,
    },
}

fn step(step: impl Into<String>, detail: impl ToString) -> ExporterBenchError {
    ExporterBenchError::Step {
        step: step.into(),
        detail: detail.to_string(),
    }
}

/// The benchmark's parameters.
#[derive(Debug, Clone)]
pub struct ExporterSpec {
    /// The tierstack binary.
    pub exe: PathBuf,
    /// The work folder (made; removed at the end).
    pub root: PathBuf,
    /// Mounts.
    pub mounts: usize,
    /// Files of 4 KiB written into each mount.
    pub files: usize,
    /// Scrapes.
    pub scrapes: usize,
}

/// Milliseconds: median, smallest and largest.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ms {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Ms {
    fn of(mut v: Vec<f64>) -> Ms {
        v.sort_by(f64::total_cmp);
        Ms {
            median: v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct ExporterReport {
    /// Mounts scraped.
    pub mounts: usize,
    /// Files written into each.
    pub files_per_mount: usize,
    /// Seconds the files took to write.
    pub write_s: f64,
    /// One scrape over HTTP (ms).
    pub scrape_ms: Ms,
    /// The median scrape per mount (ms).
    pub ms_per_mount: f64,
    /// The exporter's own gathering time per scrape (ms).
    pub gather_ms: Ms,
    /// The mean round trip of one `status` request, as the mounts counted it (ms).
    pub status_rtt_ms: f64,
    /// Mounts the exporter reported at the last scrape.
    pub mounts_seen: usize,
    /// Files still waiting to drain at the last scrape, over all mounts (the drains ran).
    pub backlog_files: f64,
    /// Bytes of the last scrape's text.
    pub bytes: usize,
    /// The target per mount (ms).
    pub target_ms_per_mount: f64,
    /// Whether the median per mount met it.
    pub met: bool,
}

/// The mounts made so far and the exporter: stopped and removed however the run ends.
struct Bed {
    exe: PathBuf,
    run_dir: PathBuf,
    root: PathBuf,
    mounts: Vec<PathBuf>,
    exporter: Option<Child>,
}

impl Bed {
    fn tierstack(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(args)
            .env("TIERSTACK_RUN_DIR", &self.run_dir)
            .env_remove("SLURM_JOB_ID")
            .stdin(Stdio::null());
        c
    }

    fn mount(&mut self, i: usize) -> Result<(), ExporterBenchError> {
        let base = self.root.join(format!("m{i:02}"));
        let (backing, mnt, fast) = (base.join("backing"), base.join("mnt"), base.join("fast"));
        for d in [&backing, &mnt] {
            std::fs::create_dir_all(d).map_err(|e| step(format!("mkdir {}", d.display()), e))?;
        }
        let o = self
            .tierstack(&[
                "mount",
                &backing.display().to_string(),
                &mnt.display().to_string(),
                "--dir",
                &fast.display().to_string(),
                "--dram",
                "64M",
                "--drive-size",
                "64M",
                "--drain-rate",
                DRAIN_RATE,
            ])
            .output()
            .map_err(|e| step("tierstack mount", e))?;
        if !o.status.success() {
            return Err(step(
                format!("tierstack mount {}", mnt.display()),
                String::from_utf8_lossy(&o.stderr).trim(),
            ));
        }
        self.mounts.push(mnt);
        Ok(())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(mut c) = self.exporter.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for m in &self.mounts {
            let _ = self
                .tierstack(&["umount", &m.display().to_string(), "--force"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Writes `n` files of 4 KiB into `dir`, 100 to a folder.
fn write_files(dir: &Path, n: usize) -> std::io::Result<()> {
    let data = vec![0x5au8; 4096];
    for i in 0..n {
        let d = dir.join(format!("d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("f{i}")), &data)?;
    }
    Ok(())
}

/// A free local TCP port.
fn free_port() -> Result<u16, ExporterBenchError> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| step("find a free port", e))
}

/// GET /metrics on `port`: the body of a 200 answer.
fn scrape(port: u16) -> Result<String, ExporterBenchError> {
    let mut s =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| step("connect to the exporter", e))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| step("scrape", e))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .map_err(|e| step("scrape", e))?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| step("scrape", e))?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| step("scrape", "no HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(step("scrape", head.lines().next().unwrap_or("")));
    }
    Ok(body.to_string())
}

/// The sum over every series of metric `name` in a scrape's text.
pub fn sum_of(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs the benchmark.
pub fn run(spec: &ExporterSpec) -> Result<ExporterReport, ExporterBenchError> {
    if spec.root.exists() {
        return Err(step(
            "prepare",
            format!(
                "{} exists: give a --dir that does not (the benchmark removes it at the end)",
                spec.root.display()
            ),
        ));
    }
    let run_dir = spec.root.join("run");
    std::fs::create_dir_all(&run_dir).map_err(|e| step("prepare", e))?;
    let mut bed = Bed {
        exe: spec.exe.clone(),
        run_dir,
        root: spec.root.clone(),
        mounts: Vec::new(),
        exporter: None,
    };
    for i in 0..spec.mounts {
        bed.mount(i)?;
    }
    let t0 = Instant::now();
    let writers = spec.mounts.clamp(1, 4);
    std::thread::scope(|sc| {
        let handles: Vec<_> = bed
            .mounts
            .chunks(spec.mounts.div_ceil(writers).max(1))
            .map(|chunk| {
                sc.spawn(move || -> std::io::Result<()> {
                    for m in chunk {
                        write_files(m, spec.files)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a writer panicked")))
                .map_err(|e| step("write the files", e))?;
        }
        Ok::<(), ExporterBenchError>(())
    })?;
    let write_s = t0.elapsed().as_secs_f64();
    let port = free_port()?;
    let child = bed
        .tierstack(&["exporter", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| step("start tierstack exporter", e))?;
    bed.exporter = Some(child);
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            return Err(step(
                "start tierstack exporter",
                format!("it does not listen on port {port} after 20 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut times, mut gather) = (Vec::new(), Vec::new());
    let mut body = String::new();
    for _ in 0..spec.scrapes.max(1) {
        let t = Instant::now();
        body = scrape(port)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        gather.push(sum_of(&body, "tierstack_exporter_scrape_duration_seconds") * 1e3);
        std::thread::sleep(Duration::from_millis(200));
    }
    let scrape_ms = Ms::of(times);
    let ms_per_mount = scrape_ms.median / spec.mounts.max(1) as f64;
    let rtt = sum_of(&body, "tierstack_control_request_duration_seconds_sum")
        / sum_of(&body, "tierstack_control_request_duration_seconds_count")
        * 1e3;
    Ok(ExporterReport {
        mounts: spec.mounts,
        files_per_mount: spec.files,
        write_s,
        scrape_ms,
        ms_per_mount,
        gather_ms: Ms::of(gather),
        status_rtt_ms: rtt,
        mounts_seen: sum_of(&body, "tierstack_exporter_mounts") as usize,
        backlog_files: sum_of(&body, "tierstack_drain_backlog_files"),
        bytes: body.len(),
        target_ms_per_mount: TARGET_MS_PER_MOUNT,
        met: ms_per_mount <= TARGET_MS_PER_MOUNT,
    })
}

/// The report as the command prints it.
pub fn table(r: &ExporterReport) -> String {
    format!(
        "{} mounts, {} files of 4 KiB each (written in {:.1} s), drains running ({} files waiting at the last scrape)\n\
         scrape over HTTP: median {:.1} ms (min {:.1}, max {:.1}) = {:.2} ms per mount (target <= {:.0}: {})\n\
         exporter's gathering: median {:.1} ms; one status round trip: mean {:.2} ms; {} bytes of text; {} mounts seen\n",
        r.mounts,
        r.files_per_mount,
        r.write_s,
        r.backlog_files,
        r.scrape_ms.median,
        r.scrape_ms.min,
        r.scrape_ms.max,
        r.ms_per_mount,
        r.target_ms_per_mount,
        if r.met { "met" } else { "not met" },
        r.gather_ms.median,
        r.status_rtt_ms,
        r.bytes,
        r.mounts_seen
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_series_of_a_metric_and_nothing_else() {
        let body = "# HELP x y\n\
                    tierstack_drain_backlog_files{mountpoint=\"/a\"} 3\n\
                    tierstack_drain_backlog_files{mountpoint=\"/b\"} 4\n\
                    tierstack_drain_backlog_files_total{mountpoint=\"/b\"} 100\n\
                    tierstack_exporter_mounts 2\n";
        assert_eq!(sum_of(body, "tierstack_drain_backlog_files"), 7.0);
        assert_eq!(sum_of(body, "tierstack_exporter_mounts"), 2.0);
        assert_eq!(sum_of(body, "tierstack_missing"), 0.0);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_upper_middle() {
        let m = Ms::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((m.median, m.min, m.max), (3.0, 1.0, 4.0));
    }
}
