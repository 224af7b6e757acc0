//! `bench io --plot FILE.png`: seed 001's heat maps, write and read bandwidth over ranks ×
//! transfer size, one panel per target (plain, mount), each cell labelled with its MiB/s.
//! Drawn with `plotters` into an RGB buffer and encoded with `png`, like `bench mem --plot`.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{short_size, Report, Row};
use crate::plot::draw_err;
use crate::BenchError;

const PANEL_W: u32 = 720;
const PANEL_H: u32 = 520;
const HEAD: u32 = 90;

/// A dark-blue to yellow ramp (viridis-like) for `t` in 0..=1.
fn ramp(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 5] = [
        (68, 1, 84),
        (59, 82, 139),
        (33, 145, 140),
        (94, 201, 98),
        (253, 231, 37),
    ];
    let t = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Draws the heat maps of `r` into a PNG at `path`.
pub fn plot_io(path: &Path, r: &Report) -> Result<(), BenchError> {
    crate::plot::check_font()?;
    crate::plot::check_target(path)?;
    let targets: Vec<&str> = ["plain", "mount"]
        .into_iter()
        .filter(|t| r.rows.iter().any(|x| x.target == *t))
        .collect();
    if targets.is_empty() {
        return Err(BenchError::NothingToPlot("the sweep has no rows"));
    }
    let mut ranks: Vec<usize> = r.rows.iter().map(|x| x.ranks).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut blocks: Vec<u64> = r.rows.iter().map(|x| x.block).collect();
    blocks.sort_unstable();
    blocks.dedup();
    let w = PANEL_W * targets.len() as u32;
    let h = HEAD + 2 * PANEL_H;
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (title, body) = root.split_vertically(HEAD);
        let top = Pos::new(HPos::Center, VPos::Top);
        let l1 =
            "tierstack bench io: bandwidth MiB/s (IOR method, mean of repetitions)".to_string();
        let l2 = format!(
            "{}, {} per rank, {}, {} offsets, {} reps; {} on {} ({} CPUs)",
            if r.file_per_process {
                "file per process"
            } else {
                "shared file"
            },
            short_size(r.size_per_rank),
            if r.fsync { "fsync" } else { "no fsync" },
            if r.random { "random" } else { "sequential" },
            r.reps,
            r.host.mpi,
            r.host.hostname,
            r.host.cpus
        );
        for (text, size, y) in [(l1, 26, 12), (l2, 18, 50)] {
            let style = TextStyle::from(("sans-serif", size).into_font()).pos(top);
            title
                .draw_text(&text, &style, ((w / 2) as i32, y))
                .map_err(draw_err)?;
        }
        let (write_row, read_row) = body.split_vertically(PANEL_H);
        for (area, write) in [(write_row, true), (read_row, false)] {
            let value = |x: &Row| if write { x.write_mibps } else { x.read_mibps };
            // One scale per operation across the targets, so the panels compare.
            let max = r.rows.iter().map(value).fold(0.0f64, f64::max).max(1e-9);
            let panels = area.split_evenly((1, targets.len()));
            for (p, target) in panels.iter().zip(&targets) {
                let name = if *target == "plain" {
                    "plain folder"
                } else {
                    "tierstack mount"
                };
                let op = if write { "write" } else { "read" };
                p.draw_text(
                    &format!("{op}, {name}"),
                    &TextStyle::from(("sans-serif", 22).into_font()).pos(top),
                    ((PANEL_W / 2) as i32, 8),
                )
                .map_err(draw_err)?;
                let (x0, y0) = (110i32, 44i32);
                let gw = PANEL_W as i32 - x0 - 30;
                let gh = PANEL_H as i32 - y0 - 70;
                let cw = gw / blocks.len() as i32;
                let ch = gh / ranks.len() as i32;
                let label = TextStyle::from(("sans-serif", 18).into_font());
                for (yi, n) in ranks.iter().enumerate() {
                    // Most ranks at the top, as in the seed's figures.
                    let y = y0 + (ranks.len() - 1 - yi) as i32 * ch;
                    p.draw_text(
                        &format!("{n} ranks"),
                        &label.pos(Pos::new(HPos::Right, VPos::Center)),
                        (x0 - 10, y + ch / 2),
                    )
                    .map_err(draw_err)?;
                    for (xi, b) in blocks.iter().enumerate() {
                        let x = x0 + xi as i32 * cw;
                        let cell = r
                            .rows
                            .iter()
                            .find(|q| q.target == *target && q.ranks == *n && q.block == *b);
                        let (color, text) = match cell {
                            Some(q) => {
                                let v = value(q);
                                (ramp(v / max), format!("{v:.0}"))
                            }
                            None => (RGBColor(220, 220, 220), "-".to_string()),
                        };
                        p.draw(&Rectangle::new(
                            [(x + 1, y + 1), (x + cw - 1, y + ch - 1)],
                            color.filled(),
                        ))
                        .map_err(draw_err)?;
                        let ink = if cell.is_some_and(|q| value(q) / max > 0.55) {
                            BLACK
                        } else {
                            WHITE
                        };
                        p.draw_text(
                            &text,
                            &TextStyle::from(("sans-serif", 20).into_font())
                                .color(&ink)
                                .pos(Pos::new(HPos::Center, VPos::Center)),
                            (x + cw / 2, y + ch / 2),
                        )
                        .map_err(draw_err)?;
                    }
                }
                for (xi, b) in blocks.iter().enumerate() {
                    p.draw_text(
                        &short_size(*b),
                        &label.pos(top),
                        (x0 + xi as i32 * cw + cw / 2, y0 + gh + 8),
                    )
                    .map_err(draw_err)?;
                }
                p.draw_text(
                    "transfer size (--block)",
                    &label.pos(top),
                    (x0 + gw / 2, y0 + gh + 36),
                )
                .map_err(draw_err)?;
            }
        }
        root.present().map_err(draw_err)?;
    }
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().map_err(BenchError::Encode)?;
        wr.write_image_data(&buf).map_err(BenchError::Encode)?;
    }
    std::fs::write(path, &png)
        .map_err(|e| tierstack_common::io_err("write the plot to", path)(e).into())
}

#[cfg(test)]
mod tests {
    use super::super::mpi::Launcher;
    use super::super::{Host, PhaseLine, Report, Row, RowBase};
    use super::*;

    #[test]
    fn draws_heat_maps() {
        if crate::plot::check_font().is_err() {
            eprintln!("SKIP draws_heat_maps: no TrueType font (fonts-dejavu-core)");
            return;
        }
        let mut rows = Vec::new();
        for (i, target) in ["plain", "mount"].into_iter().enumerate() {
            for (j, ranks) in [2usize, 4].into_iter().enumerate() {
                let l = |op: &str| PhaseLine {
                    rep: 0,
                    op: op.into(),
                    ranks: vec![[0.0, 0.0, 1.0, 1.0 + (i + j) as f64, 1048576.0, 0.0]; ranks],
                };
                let base = RowBase {
                    target: target.into(),
                    ranks,
                    block: 1 << 20,
                    file_per_process: true,
                    random: false,
                    fsync: true,
                    size_per_rank: 1 << 20,
                    reps: 1,
                    test_id: j,
                };
                rows.push(Row::from_phases(base, &[l("write"), l("read")]).unwrap());
            }
        }
        let r = Report {
            rows,
            host: Host {
                hostname: "h".into(),
                cpus: 2,
                mpi: "mpirun (Open MPI) 4.1.4".into(),
                launcher: Launcher::Mpirun,
                kernel: "6".into(),
            },
            drain_seconds: Some(0.5),
            ratios: Vec::new(),
            target: "/t".into(),
            mount_mode: None,
            mount_conditioned: None,
            mount_transport: None,
            size_per_rank: 1 << 20,
            file_per_process: true,
            fsync: true,
            random: false,
            reps: 1,
            drop_cache: false,
            verify: false,
        };
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("io.png");
        assert_eq!(plot_io(&p, &r).map_err(|e| e.to_string()), Ok(()));
        let b = std::fs::read(&p).unwrap_or_default();
        assert!(b.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(plot_io(&d.path().join("no/io.png"), &r).is_err());
    }
}
