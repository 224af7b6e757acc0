//! The text of `bench io`: IOR's `Summary of all tests:` table (IOR 3.3/4 columns and
//! widths, so that existing parsers keep working), the compact grids of the sweep
//! (ranks × block) for each target and their ratio, CSV, and a parser for the summary table.

use super::{Report, Row};
use crate::BenchError;

const MIB: f64 = 1048576.0;

/// IOR's header line of the summary table.
pub const SUMMARY_HEADER: &str = "Operation   Max(MiB)   Min(MiB)  Mean(MiB)     StdDev   Max(OPs)   Min(OPs)  Mean(OPs)     StdDev    Mean(s) Stonewall(s) Stonewall(MiB) Test# #Tasks tPN reps fPP reord reordoff reordrand seed segcnt   blksiz    xsize aggs(MiB)   API RefNum";

fn summary_line(r: &Row, write: bool) -> String {
    let (op, bw, ops, times) = if write {
        ("write", &r.write_mib, &r.write_ops_stats, &r.write_s)
    } else {
        ("read", &r.read_mib, &r.read_ops_stats, &r.read_s)
    };
    let mean_s = if times.is_empty() {
        0.0
    } else {
        times.iter().sum::<f64>() / times.len() as f64
    };
    // IOR's -C (reorder tasks, offset 1) is what the read phase does when there are peers.
    let reord = (r.ranks > 1) as u8;
    format!(
        "{:<9} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.5} {:>10} {:>13} {:>5} {:>6} {:>3} {:>4} {:>3} {:>5} {:>8} {:>9} {:>4} {:>6} {:>8} {:>8} {:>9.1} {:>5} {:>6}",
        op,
        bw.max,
        bw.min,
        bw.mean,
        bw.stddev,
        ops.max,
        ops.min,
        ops.mean,
        ops.stddev,
        mean_s,
        "NA",
        "NA",
        r.test_id,
        r.ranks,
        r.ranks, // tasks per node: one node
        r.reps,
        r.file_per_process as u8,
        reord,
        1,
        0,
        0,
        1,
        r.size_per_rank,
        r.block,
        r.aggregate_bytes as f64 / MIB,
        r.api,
        0
    )
}

/// `Summary of all tests:` and IOR's table for these rows (write and read line per row).
pub fn render_summary(rows: &[&Row]) -> String {
    let mut s = String::from("Summary of all tests:\n");
    s.push_str(SUMMARY_HEADER);
    s.push('\n');
    for r in rows {
        s.push_str(&summary_line(r, true));
        s.push('\n');
        s.push_str(&summary_line(r, false));
        s.push('\n');
    }
    s
}

/// One data line of IOR's summary table, parsed back.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryLine {
    /// `write` or `read`.
    pub operation: String,
    /// Max(MiB): the highest bandwidth of a repetition, MiB/s.
    pub max_mib: f64,
    /// Min(MiB): the lowest bandwidth of a repetition, MiB/s.
    pub min_mib: f64,
    /// Mean(MiB): the mean bandwidth, MiB/s.
    pub mean_mib: f64,
    /// StdDev of the bandwidth (the first StdDev column), MiB/s.
    pub stddev_mib: f64,
    /// Mean(OPs): transfers per second, mean over the repetitions.
    pub mean_ops: f64,
    /// Mean(s): the mean phase time, seconds.
    pub mean_s: f64,
    /// Test#: the point's number in the sweep.
    pub test: usize,
    /// #Tasks: the number of ranks.
    pub tasks: usize,
    /// reps: the number of repetitions.
    pub reps: usize,
    /// fPP: a file per process.
    pub fpp: bool,
    /// blksiz: bytes per rank (IOR's block size).
    pub blksiz: u64,
    /// xsize: the transfer size in bytes.
    pub xsize: u64,
    /// aggs(MiB): MiB of one phase, all ranks together.
    pub aggs_mib: f64,
    /// API: the I/O interface (`POSIX`).
    pub api: String,
}

/// Parses the lines of every `Summary of all tests:` table in `text` (as IOR users' scripts
/// do: by header position, whitespace-separated).
pub fn parse_summary(text: &str) -> Result<Vec<SummaryLine>, BenchError> {
    let mut out = Vec::new();
    let mut header: Option<Vec<&str>> = None;
    for line in text.lines() {
        if line.starts_with("Operation ") && line.contains("Max(MiB)") {
            header = Some(line.split_whitespace().collect());
            continue;
        }
        let Some(h) = &header else { continue };
        let cells: Vec<&str> = line.split_whitespace().collect();
        if cells.len() != h.len() || !(cells[0] == "write" || cells[0] == "read") {
            header = None;
            continue;
        }
        let col = |name: &str, nth: usize| -> Result<&str, BenchError> {
            h.iter()
                .enumerate()
                .filter(|(_, c)| **c == name)
                .nth(nth)
                .map(|(i, _)| cells[i])
                .ok_or_else(|| BenchError::NoColumn(name.to_string()))
        };
        let bad =
            |name: &str, source: Box<dyn std::error::Error + Send + Sync>| BenchError::BadColumn {
                column: name.to_string(),
                line: line.to_string(),
                source,
            };
        let f = |name: &str, nth: usize| -> Result<f64, BenchError> {
            col(name, nth)?
                .parse::<f64>()
                .map_err(|e| bad(name, Box::new(e)))
        };
        let u = |name: &str| -> Result<u64, BenchError> {
            col(name, 0)?
                .parse::<u64>()
                .map_err(|e| bad(name, Box::new(e)))
        };
        out.push(SummaryLine {
            operation: cells[0].to_string(),
            max_mib: f("Max(MiB)", 0)?,
            min_mib: f("Min(MiB)", 0)?,
            mean_mib: f("Mean(MiB)", 0)?,
            stddev_mib: f("StdDev", 0)?,
            mean_ops: f("Mean(OPs)", 0)?,
            mean_s: f("Mean(s)", 0)?,
            test: u("Test#")? as usize,
            tasks: u("#Tasks")? as usize,
            reps: u("reps")? as usize,
            fpp: u("fPP")? == 1,
            blksiz: u("blksiz")?,
            xsize: u("xsize")?,
            aggs_mib: f("aggs(MiB)", 0)?,
            api: col("API", 0)?.to_string(),
        });
    }
    Ok(out)
}

fn axes(rows: &[&Row]) -> (Vec<usize>, Vec<u64>) {
    let mut ranks: Vec<usize> = rows.iter().map(|r| r.ranks).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut blocks: Vec<u64> = rows.iter().map(|r| r.block).collect();
    blocks.sort_unstable();
    blocks.dedup();
    (ranks, blocks)
}

/// A ranks × block grid of `value` (seed 001's tables).
fn grid(title: &str, rows: &[&Row], value: impl Fn(&Row) -> Option<f64>, prec: usize) -> String {
    let (ranks, blocks) = axes(rows);
    let labels: Vec<String> = blocks.iter().map(|b| super::short_size(*b)).collect();
    let mut header: Vec<&str> = vec!["ranks"];
    header.extend(labels.iter().map(String::as_str));
    let body: Vec<Vec<String>> = ranks
        .iter()
        .map(|&n| {
            let mut line = vec![n.to_string()];
            for &b in &blocks {
                line.push(
                    rows.iter()
                        .find(|r| r.ranks == n && r.block == b)
                        .and_then(|r| value(r))
                        .map(|v| format!("{v:.prec$}"))
                        .unwrap_or_else(|| "-".into()),
                );
            }
            line
        })
        .collect();
    format!("{title}\n{}", crate::table::render(&header, &body))
}

/// Everything `bench io` prints without --json.
pub fn render(r: &Report) -> String {
    let mut s = format!(
        "bench io: IOR method, POSIX, {}, {} per rank, {}, {} offsets, {} repetition{}{}{}\n{}, ranks by {}, on {} ({} CPUs), target {}\n",
        if r.file_per_process {
            "file per process"
        } else {
            "single shared file"
        },
        crate::fmt_size(r.size_per_rank),
        if r.fsync { "fsync before close" } else { "no fsync" },
        if r.random { "random" } else { "sequential" },
        r.reps,
        if r.reps == 1 { "" } else { "s" },
        if r.drop_cache {
            ", reader's file dropped from the page cache"
        } else {
            ""
        },
        if r.verify { ", reads verified" } else { "" },
        r.host.mpi,
        r.host.launcher,
        r.host.hostname,
        r.host.cpus,
        r.target
    );
    for target in ["plain", "mount"] {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.target == target).collect();
        if rows.is_empty() {
            continue;
        }
        let what = if target == "plain" {
            "straight into the target folder".to_string()
        } else {
            let cond = match r.mount_conditioned {
                Some((b, secs)) if b > 0 => format!(
                    "; its new fast tier conditioned first: {} MiB in {secs:.1} s",
                    b >> 20
                ),
                _ => String::new(),
            };
            format!(
                "through a tierstack mount over a subfolder of the target (mode {}, transport {}{cond})",
                r.mount_mode.as_deref().unwrap_or("default"),
                r.mount_transport.as_deref().unwrap_or("default")
            )
        };
        s.push_str(&format!("\n== {target}: {what}\n\n"));
        s.push_str(&render_summary(&rows));
        s.push('\n');
        s.push_str(&grid(
            "write MiB/s (mean)",
            &rows,
            |x| Some(x.write_mibps),
            1,
        ));
        s.push('\n');
        s.push_str(&grid("read MiB/s (mean)", &rows, |x| Some(x.read_mibps), 1));
        if target == "mount" {
            s.push('\n');
            s.push_str(&grid(
                "drain s (after the ranks ended, until nothing was dirty)",
                &rows,
                |x| x.drain_seconds,
                2,
            ));
        }
        let errors: u64 = rows.iter().map(|x| x.read_errors).sum();
        if errors > 0 {
            s.push_str(&format!(
                "\nWARNING: {errors} transfers read back differ from what was written or came up short\n"
            ));
        }
    }
    if !r.ratios.is_empty() {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.target == "mount").collect();
        let ratio = |write: bool| {
            move |x: &Row| {
                r.ratios
                    .iter()
                    .find(|q| q.ranks == x.ranks && q.block == x.block)
                    .map(|q| if write { q.write } else { q.read })
            }
        };
        s.push_str("\n== mount / plain (same run)\n\n");
        s.push_str(&grid("write", &rows, ratio(true), 2));
        s.push('\n');
        s.push_str(&grid("read", &rows, ratio(false), 2));
    }
    if let Some(d) = r.drain_seconds {
        s.push_str(&format!(
            "\ndrain: {d:.2} s in all after the ranks ended (the job's view is the bandwidth above; the data was safe in the backing folder only after the drain)\n"
        ));
    }
    s
}

/// One CSV line per row.
pub fn render_csv(r: &Report) -> String {
    let mut s = String::from(
        "target,ranks,block,api,file_per_process,random,fsync,size_per_rank,reps,write_mibps,write_mibps_max,write_mibps_min,write_mibps_stddev,read_mibps,read_mibps_max,read_mibps_min,read_mibps_stddev,write_ops,read_ops,write_mean_s,read_mean_s,drain_seconds\n",
    );
    for x in &r.rows {
        let mean = |v: &[f64]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.6},{:.6},{}\n",
            x.target,
            x.ranks,
            x.block,
            x.api,
            x.file_per_process,
            x.random,
            x.fsync,
            x.size_per_rank,
            x.reps,
            x.write_mibps,
            x.write_mib.max,
            x.write_mib.min,
            x.write_mib.stddev,
            x.read_mibps,
            x.read_mib.max,
            x.read_mib.min,
            x.read_mib.stddev,
            x.write_ops,
            x.read_ops,
            mean(&x.write_s),
            mean(&x.read_s),
            x.drain_seconds.map(|d| format!("{d:.3}")).unwrap_or_default()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::{PhaseLine, Row, RowBase};
    use super::*;

    fn row() -> Row {
        let l = |op: &str, end: f64| PhaseLine {
            rep: 0,
            op: op.into(),
            ranks: vec![[0.0, 0.0, end, end, 134217728.0, 0.0]; 4],
        };
        Row::from_phases(
            RowBase {
                target: "plain".into(),
                ranks: 4,
                block: 1 << 20,
                file_per_process: true,
                random: false,
                fsync: true,
                size_per_rank: 128 << 20,
                reps: 1,
                test_id: 2,
            },
            &[l("write", 2.0), l("read", 0.5)],
        )
        .unwrap()
    }

    #[test]
    fn summary_has_ior_columns_and_parses_back() {
        let r = row();
        let text = render_summary(&[&r]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Summary of all tests:");
        assert_eq!(lines[1], SUMMARY_HEADER);
        // Same number of fields as the header, as IOR's own output.
        assert_eq!(
            lines[2].split_whitespace().count(),
            SUMMARY_HEADER.split_whitespace().count()
        );
        // IOR's layout: operation in 9, then 10-wide figures.
        assert!(
            lines[2].starts_with("write         256.00     256.00     256.00       0.00"),
            "{}",
            lines[2]
        );
        let p = parse_summary(&text).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].operation, "write");
        assert_eq!(p[0].mean_mib, 256.0);
        assert_eq!(p[1].mean_mib, 1024.0);
        assert_eq!(p[0].tasks, 4);
        assert_eq!(p[0].test, 2);
        assert_eq!(p[0].xsize, 1 << 20);
        assert_eq!(p[0].blksiz, 128 << 20);
        assert_eq!(p[0].aggs_mib, 512.0);
        assert!(p[0].fpp);
        assert_eq!(p[0].api, "POSIX");
        assert!((p[0].mean_s - 2.0).abs() < 1e-9);
    }

    #[test]
    fn parses_real_ior_output() {
        // IOR 3.3's summary table as it prints it.
        let ior = "Summary of all tests:\nOperation   Max(MiB)   Min(MiB)  Mean(MiB)     StdDev   Max(OPs)   Min(OPs)  Mean(OPs)     StdDev    Mean(s) Stonewall(s) Stonewall(MiB) Test# #Tasks tPN reps fPP reord reordoff reordrand seed segcnt   blksiz    xsize aggs(MiB)   API RefNum\nwrite         912.40     912.40     912.40       0.00    3649.62    3649.62    3649.62       0.00    0.00877         NA            NA     0      8   8    1   0     0        1         0    0      1  1048576   262144       8.0 POSIX      0\nFinished            : Sat\n";
        let p = parse_summary(ior).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].tasks, 8);
        assert_eq!(p[0].xsize, 262144);
        // Our line has IOR's field widths.
        let mut r = row();
        r.size_per_rank = 1 << 20;
        r.aggregate_bytes = 8 << 20;
        let ours = summary_line(&r, true);
        let theirs = ior.lines().nth(2).unwrap();
        let cols = |s: &str| -> Vec<usize> {
            // End position of each field.
            let b = s.as_bytes();
            (0..b.len())
                .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
                .collect()
        };
        assert_eq!(cols(&ours), cols(theirs));
    }
}
