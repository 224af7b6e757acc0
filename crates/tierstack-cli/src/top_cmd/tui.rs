//! The interactive view (ratatui over crossterm).

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use tierstack_common::fmt_size;
use tierstack_node::top::{eta, frame, mbs, sample, tiers_line, Frame};

use crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Overview,
    Ops,
}

#[derive(Clone, Copy)]
enum SortKey {
    Name,
    Backlog,
    Io,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Name => SortKey::Backlog,
            SortKey::Backlog => SortKey::Io,
            SortKey::Io => SortKey::Name,
        }
    }
    fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Backlog => "backlog",
            SortKey::Io => "i/o",
        }
    }
}

/// Restores the terminal however the view ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

pub fn run(interval: Duration) -> Result<()> {
    let mut term = ratatui::try_init().map_err(|e| {
        anyhow!("cannot start the terminal view ({e}): use `tierstack top --batch`")
    })?;
    let _restore = Restore;
    let mut view = View::Overview;
    let mut sort = SortKey::Name;
    let mut interval = interval;
    let mut prev = sample();
    let mut f = frame(&prev, &prev);
    let mut next = Instant::now() + interval.min(Duration::from_millis(500));
    loop {
        if Instant::now() >= next {
            let cur = sample();
            f = frame(&prev, &cur);
            prev = cur;
            next = Instant::now() + interval;
        }
        let mut shown = f.clone();
        match sort {
            SortKey::Name => {}
            SortKey::Backlog => {
                shown
                    .mounts
                    .sort_by_key(|m| std::cmp::Reverse(m.drain.dirty_bytes));
                shown.runs.sort_by_key(|r| std::cmp::Reverse(r.rss_bytes));
            }
            SortKey::Io => {
                let io = |r: f64, w: f64| r + w;
                shown.mounts.sort_by(|a, b| {
                    io(b.read_bytes_per_s, b.write_bytes_per_s)
                        .total_cmp(&io(a.read_bytes_per_s, a.write_bytes_per_s))
                });
                shown.runs.sort_by(|a, b| {
                    io(b.read_bytes_per_s, b.write_bytes_per_s)
                        .total_cmp(&io(a.read_bytes_per_s, a.write_bytes_per_s))
                });
                shown.devices.sort_by(|a, b| {
                    io(b.read_bytes_per_s, b.write_bytes_per_s)
                        .total_cmp(&io(a.read_bytes_per_s, a.write_bytes_per_s))
                });
            }
        }
        term.draw(|fr| draw(fr, &shown, view, sort, interval))?;
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(event::KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char('s') => sort = sort.next(),
                    KeyCode::Char('v') | KeyCode::Tab => {
                        view = if view == View::Overview {
                            View::Ops
                        } else {
                            View::Overview
                        }
                    }
                    KeyCode::Char('+') => interval = (interval * 2).min(Duration::from_secs(60)),
                    KeyCode::Char('-') => interval = (interval / 2).max(Duration::from_millis(100)),
                    _ => {}
                }
            }
        }
    }
}

/// Draws one screen: the title, the mounts (or their operations), the runs, the devices and
/// the keys.
fn draw(fr: &mut ratatui::Frame, f: &Frame, view: View, sort: SortKey, interval: Duration) {
    let head = Style::default().add_modifier(Modifier::BOLD);
    let areas = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(4),
        Constraint::Length((f.runs.len() as u16 + 3).min(12)),
        Constraint::Length((f.devices.len() as u16 + 3).min(10)),
        Constraint::Length(1),
    ])
    .split(fr.area());
    fr.render_widget(title(f, view, sort, interval).style(head), areas[0]);
    match view {
        View::Overview => fr.render_widget(mounts_table(f, head), areas[1]),
        View::Ops => fr.render_widget(ops_table(f, head), areas[1]),
    }
    fr.render_widget(runs_table(f, head), areas[2]);
    fr.render_widget(devices_table(f, head), areas[3]);
    fr.render_widget(
        Paragraph::new("q quit   s sort   v/Tab switch view   +/- interval"),
        areas[4],
    );
}

/// The title line: counts, refresh interval, sort key and view.
fn title(f: &Frame, view: View, sort: SortKey, interval: Duration) -> Paragraph<'static> {
    Paragraph::new(Line::from(format!(
        "tierstack top  {} mount(s)  {} run(s)  every {:.1} s  sort: {}  view: {}",
        f.mounts.len(),
        f.runs.len(),
        interval.as_secs_f64(),
        sort.label(),
        if view == View::Overview {
            "overview"
        } else {
            "operations"
        }
    )))
}

/// The overview's table: one row per mount (tiers, backlog, drain, I/O).
fn mounts_table(f: &Frame, head: Style) -> Table<'static> {
    let rows = f.mounts.iter().map(|m| {
        Row::new(vec![
            m.mountpoint.display().to_string(),
            m.mode.clone(),
            tiers_line(&m.tiers),
            format!(
                "{} / {} files",
                fmt_size(m.drain.dirty_bytes),
                m.drain.dirty_files
            ),
            format!("{}/s", fmt_size(m.drain.drain_bytes_per_s as u64)),
            eta(m.drain_eta_s),
            m.stuck.to_string(),
            format!("{} / {}", mbs(m.read_bytes_per_s), mbs(m.write_bytes_per_s)),
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Percentage(18),
            Constraint::Length(5),
            Constraint::Percentage(32),
            Constraint::Length(18),
            Constraint::Length(11),
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Length(22),
        ],
    )
    .header(
        Row::new(vec![
            "mount",
            "mode",
            "tiers (used/capacity)",
            "backlog",
            "drain",
            "ETA",
            "stuck",
            "io read/write",
        ])
        .style(head),
    )
    .block(Block::default().borders(Borders::ALL).title(" mounts "))
}

/// The operations view's table: one row per FUSE operation of each mount.
fn ops_table(f: &Frame, head: Style) -> Table<'static> {
    let rows = f.mounts.iter().flat_map(|m| {
        m.ops.iter().map(move |o| {
            Row::new(vec![
                m.mountpoint.display().to_string(),
                o.op.clone(),
                format!("{:.0}", o.per_s),
                o.count.to_string(),
                o.p50_us.to_string(),
                o.p99_us.to_string(),
            ])
        })
    });
    Table::new(
        rows,
        [
            Constraint::Percentage(35),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Length(10),
        ],
    )
    .header(Row::new(vec!["mount", "op", "per s", "total", "p50 us", "p99 us"]).style(head))
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(" FUSE operations "),
    )
}

/// The table of `tierstack run`s: budget, RSS, I/O and faults.
fn runs_table(f: &Frame, head: Style) -> Table<'static> {
    let rows = f.runs.iter().map(|r| {
        Row::new(vec![
            r.pid.to_string(),
            r.cmd.clone(),
            fmt_size(r.dram_budget_bytes),
            r.rss_bytes.map_or("-".into(), fmt_size),
            format!("{} / {}", mbs(r.read_bytes_per_s), mbs(r.write_bytes_per_s)),
            format!("{} ({:.0}/s)", r.faults, r.faults_per_s),
            format!(
                "{} / {}",
                r.fault_p50_us.map_or("-".into(), |x| x.to_string()),
                r.fault_p99_us.map_or("-".into(), |x| x.to_string())
            ),
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Percentage(30),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(22),
            Constraint::Length(20),
            Constraint::Length(14),
        ],
    )
    .header(
        Row::new(vec![
            "pid",
            "command",
            "budget",
            "rss",
            "io read/write",
            "faults",
            "fault p50/p99 us",
        ])
        .style(head),
    )
    .block(Block::default().borders(Borders::ALL).title(" runs "))
}

/// The table of block devices under the arrays: read and write rates and who uses them.
fn devices_table(f: &Frame, head: Style) -> Table<'static> {
    let rows = f.devices.iter().map(|d| {
        Row::new(vec![
            d.device.clone(),
            format!("{} {:.0} IOPS", mbs(d.read_bytes_per_s), d.read_iops),
            format!("{} {:.0} IOPS", mbs(d.write_bytes_per_s), d.write_iops),
            d.used_by.join(", "),
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(24),
            Constraint::Length(24),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(vec!["device", "read", "write", "drives of"]).style(head))
    .block(Block::default().borders(Borders::ALL).title(" devices "))
}
