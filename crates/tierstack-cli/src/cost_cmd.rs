//! `tierstack cost`: the server cost model of seed 002 (Intel's Optane swap blueprint, §3).
//!
//! Server A holds all its memory in DRAM; server B holds less DRAM plus NVMe drives that
//! tierstack (or swap) pages to. Only the memory components are priced, everything else being
//! equal:
//!
//! ```text
//! relative cost (B / A) = (DRAM_to_NVMe x DRAM_B + NVMe_B) / (DRAM_to_NVMe x DRAM_A)
//! ```
//!
//! with capacities in GiB and DRAM_to_NVMe the price of a GiB of DRAM over that of a GiB of
//! NVMe. If B runs the work `slowdown` times slower, a unit of work costs `relative cost x
//! slowdown` of what it costs on A (servers paid per unit of time), and B pays off while the
//! slowdown stays below the break-even `1 / relative cost`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Args, Debug)]
pub struct CostArgs {
    /// DRAM of server A (all in DRAM), in GiB, or a size with a suffix (384G, 1T).
    #[arg(long, value_name = "GIB")]
    pub dram_a: Option<String>,
    /// DRAM of server B, in GiB or a size with a suffix.
    #[arg(long, value_name = "GIB")]
    pub dram_b: Option<String>,
    /// NVMe capacity of server B that tierstack pages to (all drives together), in GiB or a
    /// size with a suffix.
    #[arg(long, value_name = "GIB")]
    pub nvme_b: Option<String>,
    /// Price of a GiB of DRAM over the price of a GiB of NVMe (e.g. 10: DRAM costs ten times
    /// as much per GiB).
    #[arg(long, value_name = "RATIO")]
    pub dram_to_nvme: Option<f64>,
    /// Price of a GiB of DRAM (with --nvme-price: the ratio is computed from the two).
    #[arg(long, requires = "nvme_price", conflicts_with = "dram_to_nvme")]
    pub dram_price: Option<f64>,
    /// Price of a GiB of NVMe (with --dram-price).
    #[arg(long, requires = "dram_price")]
    pub nvme_price: Option<f64>,
    /// How many times longer the work takes on B than on A (e.g. 1.3).
    #[arg(long, conflicts_with = "measured")]
    pub slowdown: Option<f64>,
    /// A saved `tierstack bench mem --json` report (or --compare object: its tierstack run)
    /// measured the B way; with --baseline, the slowdown is baseline accesses/s over these.
    #[arg(long, requires = "baseline", value_name = "FILE")]
    pub measured: Option<PathBuf>,
    /// A saved `tierstack bench mem --engine dram --json` report: the A way.
    #[arg(long, requires = "measured", value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// A TOML file with any of: dram_a, dram_b, nvme_b (GiB numbers or size strings),
    /// dram_to_nvme, dram_price, nvme_price, slowdown. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The TOML file's keys (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CostFile {
    dram_a: Option<toml::Value>,
    dram_b: Option<toml::Value>,
    nvme_b: Option<toml::Value>,
    dram_to_nvme: Option<f64>,
    dram_price: Option<f64>,
    nvme_price: Option<f64>,
    slowdown: Option<f64>,
}

/// The model's answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CostReport {
    pub dram_a_gib: f64,
    pub dram_b_gib: f64,
    pub nvme_b_gib: f64,
    pub dram_to_nvme: f64,
    /// Cost of B's memory over cost of A's memory.
    pub relative_cost: f64,
    /// 1 - relative_cost (negative: B costs more).
    pub saving: f64,
    /// B pays off while it is less than this many times slower than A.
    pub break_even_slowdown: f64,
    pub slowdown: Option<f64>,
    /// Where the slowdown came from (flag, file or measured reports).
    pub slowdown_source: Option<String>,
    /// Cost of a unit of work on B over its cost on A (relative_cost x slowdown).
    pub relative_cost_per_work: Option<f64>,
    /// 1 - relative_cost_per_work.
    pub saving_per_work: Option<f64>,
}

/// The relative cost of B to A (seed 002, §3).
pub fn relative_cost(dram_to_nvme: f64, dram_a: f64, dram_b: f64, nvme_b: f64) -> f64 {
    (dram_to_nvme * dram_b + nvme_b) / (dram_to_nvme * dram_a)
}

/// Evaluates the model; `slowdown` (with its source) is optional.
pub fn model(
    dram_to_nvme: f64,
    dram_a: f64,
    dram_b: f64,
    nvme_b: f64,
    slowdown: Option<(f64, String)>,
) -> CostReport {
    let rc = relative_cost(dram_to_nvme, dram_a, dram_b, nvme_b);
    let per_work = slowdown.as_ref().map(|(s, _)| rc * s);
    CostReport {
        dram_a_gib: dram_a,
        dram_b_gib: dram_b,
        nvme_b_gib: nvme_b,
        dram_to_nvme,
        relative_cost: rc,
        saving: 1.0 - rc,
        break_even_slowdown: 1.0 / rc,
        slowdown: slowdown.as_ref().map(|(s, _)| *s),
        slowdown_source: slowdown.map(|(_, src)| src),
        relative_cost_per_work: per_work,
        saving_per_work: per_work.map(|p| 1.0 - p),
    }
}

/// A capacity in GiB: a plain number is GiB, a size with a suffix is converted.
fn gib_of(flag: &str, s: &str) -> Result<f64> {
    let t = s.trim();
    let v = if let Ok(n) = t.parse::<f64>() {
        n
    } else {
        tierstack_bench::parse_size(t)
            .map(|b| b as f64 / GIB)
            .map_err(|e| crate::usage(format!("--{flag}: {e} (or a number of GiB)")))?
    };
    if !v.is_finite() || v < 0.0 {
        usage_bail!(
            "--{flag} {s} is not a capacity: give a number of GiB (e.g. 192) or a size (192G)"
        );
    }
    Ok(v)
}

fn toml_gib(flag: &str, v: &toml::Value) -> Result<f64> {
    match v {
        toml::Value::Integer(i) => gib_of(flag, &i.to_string()),
        toml::Value::Float(f) => gib_of(flag, &f.to_string()),
        toml::Value::String(s) => gib_of(flag, s),
        other => bail!("{flag} = {other} in the cost file is not a capacity: give a number of GiB or a size string"),
    }
}

/// accesses/s of a saved `bench mem --json` report (or the tierstack run of a --compare object).
fn accesses_per_s(path: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {}: give a file saved from `tierstack bench mem --json`",
            path.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| {
        anyhow!(
            "{} is not JSON ({e}): give a file saved from `tierstack bench mem --json`",
            path.display()
        )
    })?;
    let r = if v.get("tierstack").is_some() {
        &v["tierstack"]
    } else {
        &v
    };
    match r.get("accesses_per_s").and_then(|x| x.as_f64()) {
        Some(a) if a > 0.0 => Ok(a),
        _ => bail!(
            "{} has no accesses_per_s above 0: give a file saved from `tierstack bench mem --json`",
            path.display()
        ),
    }
}

fn positive(flag: &str, v: f64) -> Result<f64> {
    if !(v.is_finite() && v > 0.0) {
        usage_bail!("--{flag} {v} must be a number above 0");
    }
    Ok(v)
}

pub fn run(a: CostArgs) -> Result<()> {
    let file = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the cost file {}", p.display()))?;
            toml::from_str::<CostFile>(&text).map_err(|e| {
                anyhow!(
                    "cost file {} is not valid ({}): use keys dram_a, dram_b, nvme_b, dram_to_nvme, dram_price, nvme_price, slowdown",
                    p.display(),
                    e.to_string().lines().next().unwrap_or("parse error")
                )
            })?
        }
        None => CostFile::default(),
    };
    let cap = |flag: &str, arg: &Option<String>, fv: &Option<toml::Value>| -> Result<f64> {
        match (arg, fv) {
            (Some(s), _) => gib_of(flag, s),
            (None, Some(v)) => toml_gib(flag, v),
            (None, None) => usage_bail!(
                "--{flag} is missing: give it (a number of GiB) or put {} in a --config file",
                flag.replace('-', "_")
            ),
        }
    };
    let dram_a = cap("dram-a", &a.dram_a, &file.dram_a)?;
    let dram_b = cap("dram-b", &a.dram_b, &file.dram_b)?;
    let nvme_b = cap("nvme-b", &a.nvme_b, &file.nvme_b)?;
    if dram_a <= 0.0 {
        usage_bail!("--dram-a must be above 0 GiB (server A's DRAM is the denominator)");
    }
    let ratio = match (a.dram_to_nvme, a.dram_price, a.nvme_price) {
        (Some(r), _, _) => positive("dram-to-nvme", r)?,
        (None, Some(d), Some(n)) => positive("dram-price", d)? / positive("nvme-price", n)?,
        _ => match (file.dram_to_nvme, file.dram_price, file.nvme_price) {
            (Some(r), _, _) => positive("dram-to-nvme", r)?,
            (None, Some(d), Some(n)) => {
                positive("dram-price", d)? / positive("nvme-price", n)?
            }
            _ => bail!(
                "no price ratio: give --dram-to-nvme RATIO (DRAM's price per GiB over NVMe's) or --dram-price and --nvme-price"
            ),
        },
    };
    let slowdown = match (&a.measured, &a.baseline, a.slowdown, file.slowdown) {
        (Some(m), Some(b), _, _) => {
            let s = accesses_per_s(b)? / accesses_per_s(m)?;
            Some((
                s,
                format!("measured: {} vs baseline {}", m.display(), b.display()),
            ))
        }
        (_, _, Some(s), _) => Some((positive("slowdown", s)?, "--slowdown".to_string())),
        (_, _, None, Some(s)) => Some((positive("slowdown", s)?, "cost file".to_string())),
        _ => None,
    };
    let r = model(ratio, dram_a, dram_b, nvme_b, slowdown);
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", render(&r));
    }
    Ok(())
}

pub fn render(r: &CostReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "server A: {:.0} GiB DRAM\nserver B: {:.0} GiB DRAM + {:.0} GiB NVMe\nDRAM/NVMe price per GiB: {}\n",
        r.dram_a_gib, r.dram_b_gib, r.nvme_b_gib, r.dram_to_nvme
    ));
    s.push_str(&format!(
        "relative cost B/A: {:.3} ({} {:.1} % on memory)\n",
        r.relative_cost,
        if r.saving >= 0.0 { "saving" } else { "costing" },
        r.saving.abs() * 100.0
    ));
    s.push_str(&format!(
        "break-even slowdown: {:.2}x (B pays while the work runs less than {:.2} times slower)\n",
        r.break_even_slowdown, r.break_even_slowdown
    ));
    if let (Some(sd), Some(pw)) = (r.slowdown, r.relative_cost_per_work) {
        s.push_str(&format!(
            "slowdown {:.2}x ({}): cost per unit of work B/A {:.3} ({})\n",
            sd,
            r.slowdown_source.as_deref().unwrap_or("given"),
            pw,
            if pw < 1.0 {
                format!("B is {:.1} % cheaper per unit of work", (1.0 - pw) * 100.0)
            } else {
                format!("B is {:.1} % dearer per unit of work", (pw - 1.0) * 100.0)
            }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 002's example: A 384 GiB DRAM; B 192 GiB DRAM + 2 x 100 GiB of swap drives; the
    /// price ratio is the user's (the seed gives none): 10 here.
    #[test]
    fn seed_example() {
        let r = model(10.0, 384.0, 192.0, 200.0, Some((1.2, "t".into())));
        assert!((r.relative_cost - 2120.0 / 3840.0).abs() < 1e-12);
        assert!((r.break_even_slowdown - 3840.0 / 2120.0).abs() < 1e-12);
        assert!((r.relative_cost_per_work.unwrap_or(0.0) - 1.2 * 2120.0 / 3840.0).abs() < 1e-12);
    }

    #[test]
    fn gib_parsing() {
        assert_eq!(gib_of("x", "384").ok(), Some(384.0));
        assert_eq!(gib_of("x", "1T").ok(), Some(1024.0));
        assert!(gib_of("x", "-1").is_err());
        assert!(gib_of("x", "lots").is_err());
    }
}
