//! PNG plots of `bench mem` reports: the read and write latency histograms in log2 nanosecond
//! bands (as pmbench prints them) of every engine that ran, one panel for reads and one for
//! writes, engines side by side in each band.
//!
//! Drawn with `plotters` into an RGB buffer and encoded with `png`; text uses a TrueType font
//! from the system (fonts-dejavu-core on Debian) or `TIERSTACK_FONT`.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

use crate::mem::MemReport;
use crate::BenchError;

const W: u32 = 1600;
const H: u32 = 1000;

/// Fonts tried in order after `TIERSTACK_FONT`.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Why no font could be registered, kept for the life of the process (a [`BenchError`] is not
/// `Clone`: it can hold an I/O error).
#[derive(Debug, Clone)]
enum NoFont {
    /// `TIERSTACK_FONT` names a file that is not a TrueType font.
    NotTrueType(std::path::PathBuf),
    /// None of the fonts tried is there.
    Missing,
}

static FONT: OnceLock<Result<(), NoFont>> = OnceLock::new();

/// Registers a system TrueType font for plot text (once per process). Call it before a long
/// benchmark so a missing font fails at once.
pub fn check_font() -> Result<(), BenchError> {
    match FONT.get_or_init(load_font) {
        Ok(()) => Ok(()),
        Err(NoFont::NotTrueType(p)) => Err(BenchError::FontNotTrueType(p.clone())),
        Err(NoFont::Missing) => Err(BenchError::NoFont),
    }
}

fn load_font() -> Result<(), NoFont> {
    let env = std::env::var_os("TIERSTACK_FONT").map(std::path::PathBuf::from);
    let candidates = env
        .iter()
        .cloned()
        .chain(FONT_PATHS.iter().map(std::path::PathBuf::from));
    for p in candidates {
        let Ok(bytes) = std::fs::read(&p) else {
            continue;
        };
        // plotters keeps fonts for the life of the process: leak one copy, once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let ok = register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            && register_font("sans-serif", FontStyle::Bold, bytes).is_ok();
        if ok {
            return Ok(());
        }
        if env.as_ref() == Some(&p) {
            return Err(NoFont::NotTrueType(p));
        }
    }
    Err(NoFont::Missing)
}

/// Checks that `path` can be written (its folder exists) before a benchmark runs.
pub fn check_target(path: &Path) -> Result<(), BenchError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(BenchError::PlotFolderMissing {
            path: path.to_path_buf(),
            folder: parent.to_path_buf(),
        });
    }
    if path.is_dir() {
        return Err(BenchError::PlotIsFolder(path.to_path_buf()));
    }
    Ok(())
}

/// Reads the reports out of `bench mem --json` output: one report object, or the `--compare`
/// object `{"tierstack": {...}, "kernel_swap": {...}, "ratio": R}`.
pub fn reports_from_json(text: &str) -> Result<Vec<MemReport>, BenchError> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(BenchError::NotMemJson)?;
    let one = |v: &serde_json::Value| {
        serde_json::from_value::<MemReport>(v.clone()).map_err(BenchError::NotMemReport)
    };
    if v.get("bands").is_some() {
        return Ok(vec![one(&v)?]);
    }
    let mut out = Vec::new();
    for key in ["tierstack", "kernel_swap", "dram"] {
        if let Some(r) = v.get(key) {
            out.push(one(r)?);
        }
    }
    if out.is_empty() {
        return Err(BenchError::NoMemReport);
    }
    Ok(out)
}

fn color(engine: &str, i: usize) -> RGBColor {
    match engine {
        "tierstack" => RGBColor(31, 119, 180),
        "kernel-swap" => RGBColor(230, 110, 10),
        "dram" => RGBColor(44, 160, 44),
        _ => [RGBColor(148, 103, 189), RGBColor(140, 86, 75)][i % 2],
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else if us >= 10.0 {
        format!("{us:.0} us")
    } else {
        format!("{us:.2} us")
    }
}

fn title_lines(reports: &[MemReport], note: Option<&str>) -> (String, String) {
    let names: Vec<&str> = reports.iter().map(|r| r.engine.as_str()).collect();
    let mut l1 = format!(
        "tierstack bench mem: {} - read and write latency, log2 ns bands",
        names.join(" vs ")
    );
    let t = reports.iter().find(|r| r.engine == "tierstack");
    let k = reports.iter().find(|r| r.engine == "kernel-swap");
    if let (Some(t), Some(k)) = (t, k) {
        if k.accesses_per_s > 0.0 {
            l1.push_str(&format!(
                "; ratio tierstack / kernel-swap accesses/s {:.2}",
                t.accesses_per_s / k.accesses_per_s
            ));
        }
    }
    let Some(r) = reports.first() else {
        return (l1, String::new());
    };
    let limit = reports
        .iter()
        .map(|r| r.dram_bytes)
        .find(|&d| d > 0)
        .map(|d| format!("DRAM limit {}", crate::fmt_size(d)))
        .unwrap_or_else(|| "no DRAM limit".into());
    let mut l2 = format!(
        "map {}, {limit}, {} thread{}, {:.0}% reads, {:?} pattern, {} s per engine, one word of one 4 KiB page per access",
        crate::fmt_size(r.map_bytes),
        r.threads,
        if r.threads == 1 { "" } else { "s" },
        r.read_ratio * 100.0,
        r.pattern,
        r.seconds,
    )
    .to_lowercase()
    .replace("dram", "DRAM")
    .replace("kib", "KiB")
    .replace("mib", "MiB")
    .replace("gib", "GiB")
    .replace("tib", "TiB");
    if let Some(n) = note {
        l2.push_str(", ");
        l2.push_str(n);
    }
    (l1, l2)
}

fn log2(ns: u64) -> i64 {
    63 - ns.max(1).leading_zeros() as i64
}

/// Bands [lo, hi) in log2 ns that hold any access or a p99 of any engine: both panels share it.
fn band_span(reports: &[MemReport]) -> (i64, i64) {
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for r in reports {
        for b in r.bands.iter().filter(|b| b.reads + b.writes > 0) {
            lo = lo.min(log2(b.lo_ns));
            hi = hi.max(log2(b.lo_ns) + 1);
        }
        if r.p99_us > 0.0 {
            let x = (r.p99_us * 1000.0).log2().floor() as i64;
            lo = lo.min(x);
            hi = hi.max(x + 1);
        }
    }
    if lo > hi {
        (8, 12)
    } else {
        (lo, hi)
    }
}

fn legend_line(r: &MemReport) -> String {
    let (reads, writes) = r
        .bands
        .iter()
        .fold((0, 0), |(a, b), x| (a + x.reads, b + x.writes));
    format!(
        "{}: {:.0} accesses/s, mean {} (reads {}, writes {}), p50 {}, p99 {}, p99.9 {}; {} reads, {} writes",
        r.engine,
        r.accesses_per_s,
        fmt_us(r.mean_us),
        fmt_us(r.read_mean_us),
        fmt_us(r.write_mean_us),
        fmt_us(r.p50_us),
        fmt_us(r.p99_us),
        fmt_us(r.p999_us),
        reads,
        writes,
    )
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// One panel: reads (`writes == false`) or writes of every engine.
fn panel(
    area: &Area,
    reports: &[MemReport],
    span: (i64, i64),
    writes: bool,
) -> Result<(), BenchError> {
    let count = |b: &crate::mem::Band| if writes { b.writes } else { b.reads };
    let (lo, hi) = span;
    // The smallest share drawn sets the bottom of the log axis.
    let mut min_share = 100.0f64;
    for r in reports {
        let total: u64 = r.bands.iter().map(count).sum();
        for b in r.bands.iter().filter(|b| count(b) > 0) {
            min_share = min_share.min(count(b) as f64 * 100.0 / total as f64);
        }
    }
    // One decade below the smallest bar, so a band with a single access still shows.
    let ymin = 10f64.powf(min_share.log10().floor() - 1.0).clamp(1e-7, 0.1);
    let what = if writes { "Writes" } else { "Reads" };
    let mut chart = ChartBuilder::on(area)
        .caption(what, ("sans-serif", 26))
        .margin(12)
        .margin_right(40)
        .x_label_area_size(58)
        .y_label_area_size(80)
        .build_cartesian_2d(lo as f64..hi as f64, (ymin..100.0f64).log_scale())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_labels((hi - lo + 1) as usize)
        .x_label_formatter(&|x| {
            if x.fract() == 0.0 {
                format!("2^{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| {
            if *y >= 1.0 {
                format!("{y:.0}%")
            } else {
                format!("{y}%")
            }
        })
        .x_desc("latency band [2^k, 2^(k+1)) ns   (2^10 ns = 1 us, 2^20 ns = 1 ms); vertical line: p99 over all accesses")
        .y_desc(format!("share of the engine's {} (log)", what.to_lowercase()))
        .axis_desc_style(("sans-serif", 17))
        .label_style(("sans-serif", 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(draw_err)?;
    let n = reports.len().max(1) as f64;
    for (i, r) in reports.iter().enumerate() {
        let c = color(&r.engine, i);
        let total: u64 = r.bands.iter().map(count).sum();
        let bars = r.bands.iter().filter(|b| count(b) > 0).map(move |b| {
            let k = log2(b.lo_ns) as f64;
            let x0 = k + 0.08 + 0.84 * i as f64 / n;
            let x1 = x0 + 0.84 / n;
            let share = count(b) as f64 * 100.0 / total.max(1) as f64;
            Rectangle::new([(x0, ymin), (x1, share)], c.filled())
        });
        chart.draw_series(bars).map_err(draw_err)?;
        if r.p99_us > 0.0 {
            let x = (r.p99_us * 1000.0).log2();
            chart
                .draw_series([
                    PathElement::new(vec![(x, ymin), (x, 100.0)], c.stroke_width(3)).into_dyn(),
                    Text::new(
                        "p99",
                        (
                            x + 0.05,
                            100.0 * (ymin / 100.0).powf(0.04 + 0.06 * i as f64),
                        ),
                        ("sans-serif", 16).into_font().color(&c),
                    )
                    .into_dyn(),
                ])
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// Draws the read and write histograms of `reports` into one PNG at `path`. `note` is added to
/// the settings line of the title (e.g. the tierstack page size).
pub fn plot_mem(path: &Path, reports: &[MemReport], note: Option<&str>) -> Result<(), BenchError> {
    if reports.is_empty() {
        return Err(BenchError::NothingToPlot("no bench mem report"));
    }
    check_font()?;
    check_target(path)?;
    let mut buf = vec![255u8; (W * H * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let head = 84 + 28 * reports.len() as u32;
        let (title, body) = root.split_vertically(head);
        let (l1, l2) = title_lines(reports, note);
        let top = Pos::new(HPos::Center, VPos::Top);
        for (text, size, y) in [(l1, 26, 10), (l2, 19, 46)] {
            let style = TextStyle::from(("sans-serif", size).into_font()).pos(top);
            title
                .draw_text(&text, &style, ((W / 2) as i32, y))
                .map_err(draw_err)?;
        }
        // Legend: one line per engine with its figures.
        for (i, r) in reports.iter().enumerate() {
            let y = 84 + 28 * i as i32;
            let c = color(&r.engine, i);
            title
                .draw(&Rectangle::new([(130, y + 2), (152, y + 20)], c.filled()))
                .map_err(draw_err)?;
            title
                .draw_text(
                    &legend_line(r),
                    &TextStyle::from(("sans-serif", 19).into_font()),
                    (162, y + 1),
                )
                .map_err(draw_err)?;
        }
        let (reads, writes) = body.split_vertically((H - head) / 2);
        let span = band_span(reports);
        panel(&reads, reports, span, false)?;
        panel(&writes, reports, span, true)?;
        root.present().map_err(draw_err)?;
    }
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, W, H);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(BenchError::Encode)?;
        w.write_image_data(&buf).map_err(BenchError::Encode)?;
    }
    std::fs::write(path, &png)
        .map_err(|e| tierstack_common::io_err("write the plot to", path)(e).into())
}

/// A plotters error as a [`BenchError::Draw`].
pub(crate) fn draw_err<E>(e: DrawingAreaErrorKind<E>) -> BenchError
where
    E: std::error::Error + Send + Sync + 'static,
{
    BenchError::Draw(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{Band, Pattern};

    fn report(engine: &str, shift: u64) -> MemReport {
        MemReport {
            engine: engine.into(),
            map_bytes: 1536 << 20,
            dram_bytes: 512 << 20,
            threads: 1,
            read_ratio: 0.5,
            pattern: Pattern::Uniform,
            seconds: 10.0,
            accesses: 0,
            accesses_per_s: 12954.0,
            mean_us: 77.0,
            p50_us: 40.0,
            p99_us: 185.0,
            p999_us: 1200.0,
            read_mean_us: 70.0,
            write_mean_us: 80.0,
            bands: (8..22)
                .map(|k| Band {
                    lo_ns: 1 << k,
                    hi_ns: 1 << (k + 1),
                    reads: 1000 >> (k as u64 % 8 + shift).min(63),
                    writes: 700 >> (k as u64 % 6 + shift).min(63),
                })
                .collect(),
            pager: None,
            peak_rss_bytes: 0,
            zswap_pool_bytes: 0,
            engine_config: None,
        }
    }

    #[test]
    fn json_forms() {
        let t = report("tierstack", 0);
        let k = report("kernel-swap", 1);
        let one = serde_json::to_string(&t).unwrap_or_default();
        assert_eq!(reports_from_json(&one).map(|v| v.len()).ok(), Some(1));
        let cmp = serde_json::json!({"tierstack": t, "kernel_swap": k, "ratio": 1.0}).to_string();
        let v = reports_from_json(&cmp).unwrap_or_default();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].engine, "kernel-swap");
        assert!(reports_from_json("{\"x\":1}").is_err());
        assert!(reports_from_json("nope").is_err());
    }

    #[test]
    fn draws_a_png() {
        if check_font().is_err() {
            eprintln!("SKIP: no font");
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tmp: {e}"));
        let p = dir.path().join("m.png");
        let rs = [report("tierstack", 0), report("kernel-swap", 1)];
        assert_eq!(
            plot_mem(&p, &rs, Some("tierstack page 4 KiB")).map_err(|e| e.to_string()),
            Ok(())
        );
        let b = std::fs::read(&p).unwrap_or_default();
        assert!(b.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(plot_mem(&dir.path().join("no/m.png"), &rs, None).is_err());
    }
}
