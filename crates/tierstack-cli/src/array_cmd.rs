//! `tierstack array ...` and `tierstack bench array`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use tierstack_array::descriptor::{self, Descriptor};
use tierstack_array::objects::ObjectStore;
use tierstack_array::{
    Array, ArrayError, ArrayOptions, ArrayStatus, CreateParams, EngineKind, Level,
};
use tierstack_bench::{fmt_size, parse_size};

#[derive(Args, Clone)]
pub struct EngineArgs {
    /// I/O engine: uring (io_uring) or psync.
    #[arg(long, default_value = "uring", global = true)]
    engine: String,
    /// io_uring queue depth.
    #[arg(long, default_value_t = 64, global = true)]
    queue_depth: u32,
    /// Never open drives with O_DIRECT.
    #[arg(long, global = true)]
    no_direct: bool,
    /// Open an array whose stripe summaries are damaged beyond repair, with those segments
    /// quarantined (never written again; `show` says `damaged`): read what is readable,
    /// then copy the data off. Without it such an array is refused.
    #[arg(long, global = true)]
    accept_damaged: bool,
}

impl EngineArgs {
    fn options(&self) -> Result<ArrayOptions> {
        let engine: EngineKind = self.engine.parse()?;
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return Err(crate::usage(format!(
                "--queue-depth {} is out of range: use 1 to 4096",
                self.queue_depth
            )));
        }
        Ok(ArrayOptions {
            engine,
            queue_depth: self.queue_depth,
            direct: !self.no_direct,
            accept_damaged: self.accept_damaged,
            ..ArrayOptions::default()
        })
    }
}

#[derive(Subcommand)]
pub enum ArrayCmd {
    /// Create an array over DRIVE... (files are created or grown to --size) and write its
    /// descriptor to ARRAY.
    Create {
        array: PathBuf,
        /// RAID level: 0, 1, 10, 5, 6, 50, 60.
        #[arg(long)]
        level: String,
        /// Chunk (strip) size per drive: a power of two from 4K to 1M.
        #[arg(long, default_value = "64K")]
        chunk: String,
        /// Parity groups for RAID 50/60 (default 2).
        #[arg(long)]
        groups: Option<usize>,
        /// Size of each file drive (created or grown to it); required for new files.
        #[arg(long)]
        size: Option<String>,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Print the array's status table (or --json).
    Show {
        array: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Store FILE (or stdin) as object KEY; durable when the command returns.
    Put {
        array: PathBuf,
        key: String,
        file: Option<PathBuf>,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Write object KEY to FILE (or stdout).
    Get {
        array: PathBuf,
        key: String,
        file: Option<PathBuf>,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Delete object KEY.
    Delete {
        array: PathBuf,
        key: String,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// List objects with their sizes.
    List {
        array: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Mark drive N failed, as if it had been pulled.
    Fail {
        array: PathBuf,
        #[arg(long)]
        drive: usize,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Put NEWDRIVE in place of failed drive N and rebuild onto it.
    Replace {
        array: PathBuf,
        #[arg(long)]
        drive: usize,
        newdrive: PathBuf,
        /// Limit the rebuild to this many bytes per second written to the new drive (e.g. 200M).
        #[arg(long)]
        rate: Option<String>,
        /// Return at once; the rebuild continues in a background process.
        #[arg(long)]
        background: bool,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Resume or run the rebuild of drives in state rebuilding.
    Rebuild {
        array: PathBuf,
        #[arg(long)]
        rate: Option<String>,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Verify every checksum and all parity; --repair fixes what redundancy allows.
    Scrub {
        array: PathBuf,
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        eng: EngineArgs,
    },
    /// Rebuild a lost descriptor ARRAY from the array's drives.
    Assemble {
        array: PathBuf,
        #[arg(required = true)]
        drives: Vec<PathBuf>,
        #[command(flatten)]
        eng: EngineArgs,
    },
}

#[derive(Args)]
pub struct BenchArrayArgs {
    /// RAID level.
    #[arg(long, default_value = "5")]
    level: String,
    /// Number of file drives.
    #[arg(long, default_value_t = 5)]
    drives: usize,
    /// Folder for the drives (on the disk or on tmpfs).
    #[arg(long)]
    dir: PathBuf,
    /// Size of each drive.
    #[arg(long, default_value = "1G")]
    size: String,
    #[arg(long, default_value = "64K")]
    chunk: String,
    #[arg(long)]
    groups: Option<usize>,
    /// Reader threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Seconds of random 4 KiB reads.
    #[arg(long, default_value_t = 3.0)]
    rand_seconds: f64,
    /// Repeat the whole run and report medians (this machine's disk is noisy).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    eng: EngineArgs,
}

fn parse_level(s: &str) -> Result<Level> {
    Ok(s.parse::<Level>()?)
}

fn parse_chunk(s: &str) -> Result<usize> {
    let c = crate::size_flag("chunk", s)?;
    if !(4096..=(1 << 20)).contains(&c) || !c.is_power_of_two() {
        return Err(crate::usage(format!(
            "chunk '{s}' is not a power of two between 4K and 1M: use e.g. --chunk 64K"
        )));
    }
    Ok(c as usize)
}

fn parse_rate(s: &Option<String>) -> Result<Option<u64>> {
    s.as_deref()
        .map(|r| crate::size_flag("rate", r))
        .transpose()
}

fn open(path: &Path, eng: &EngineArgs) -> Result<Array> {
    Ok(descriptor::open_array(path, &eng.options()?)?)
}

fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(crate::bar_style(
        "{msg} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
        crate::BAR_CHARS,
    ));
    pb.set_message(msg.to_string());
    pb
}

/// The folder a path lives in ("." for a bare file name).
fn parent_dir(p: &Path) -> &Path {
    p.parent()
        .filter(|q| !q.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks everything about a create before any file is touched.
fn precheck_create(array: &Path, drives: &[PathBuf], size: Option<u64>) -> Result<()> {
    if array.exists() {
        bail!(
            "descriptor {} already exists: remove it or choose another path",
            array.display()
        );
    }
    let parent = parent_dir(array);
    if !parent.is_dir() {
        bail!(
            "folder {} for the descriptor does not exist: create it first",
            parent.display()
        );
    }
    for d in drives {
        if d.is_dir() {
            bail!(
                "drive {} is a directory: give a file or block device path",
                d.display()
            );
        }
        if !d.exists() {
            let dp = parent_dir(d);
            if !dp.is_dir() {
                bail!(
                    "drive {}: folder {} does not exist: create it first",
                    d.display(),
                    dp.display()
                );
            }
            if size.is_none() {
                bail!(
                    "drive {} does not exist: pass --size to create file drives",
                    d.display()
                );
            }
            // Probe that we can create files there.
            let probe = dp.join(format!(".tierstack-probe-{}", std::process::id()));
            File::create(&probe).with_context(|| {
                format!(
                    "drive {}: cannot create files in {}",
                    d.display(),
                    dp.display()
                )
            })?;
            let _ = std::fs::remove_file(&probe);
        } else {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(d)
                .with_context(|| format!("drive {} is not writable", d.display()))?;
        }
    }
    Ok(())
}

pub fn run(cmd: ArrayCmd) -> Result<()> {
    match cmd {
        ArrayCmd::Create {
            array,
            level,
            chunk,
            groups,
            size,
            drives,
            eng,
        } => create(
            &array,
            &level,
            &chunk,
            groups,
            size.as_deref(),
            &drives,
            &eng,
        ),
        ArrayCmd::Show { array, json, eng } => show(&array, json, &eng),
        ArrayCmd::Put {
            array,
            key,
            file,
            eng,
        } => put(&array, &key, file.as_deref(), &eng),
        ArrayCmd::Get {
            array,
            key,
            file,
            eng,
        } => get(&array, &key, file.as_deref(), &eng),
        ArrayCmd::Delete { array, key, eng } => delete(&array, &key, &eng),
        ArrayCmd::List { array, json, eng } => list(&array, json, &eng),
        ArrayCmd::Fail { array, drive, eng } => fail(&array, drive, &eng),
        ArrayCmd::Replace {
            array,
            drive,
            newdrive,
            rate,
            background,
            eng,
        } => replace(&array, drive, &newdrive, &rate, background, &eng),
        ArrayCmd::Rebuild { array, rate, eng } => rebuild(&array, &rate, &eng),
        ArrayCmd::Scrub {
            array,
            repair,
            json,
            eng,
        } => scrub(&array, repair, json, &eng),
        ArrayCmd::Assemble { array, drives, eng } => assemble(&array, &drives, &eng),
    }
}

/// `array create`: validates the geometry, creates the array and writes its descriptor.
fn create(
    array: &Path,
    level: &str,
    chunk: &str,
    groups: Option<usize>,
    size: Option<&str>,
    drives: &[PathBuf],
    eng: &EngineArgs,
) -> Result<()> {
    let level = parse_level(level)?;
    let chunk = parse_chunk(chunk)?;
    let size = size
        .map(parse_size)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    tierstack_array::Geometry::new(level, drives.len(), chunk, groups, size.unwrap_or(u64::MAX))?;
    precheck_create(array, drives, size)?;
    let params = CreateParams {
        level,
        chunk,
        groups,
        size,
    };
    let a = Array::create(drives, &params, &eng.options()?)?;
    if let Err(e) = Descriptor::for_array(&a).save(array) {
        // Leave nothing half-created: wipe the superblocks we wrote.
        let paths = a.drive_paths();
        drop(a);
        wipe(&paths, drives);
        return Err(e.into());
    }
    let st = a.status();
    println!(
        "created RAID {} array {} over {} drives: {} usable, chunk {}, stripe {}",
        st.level,
        array.display(),
        st.drives_total,
        fmt_size(st.capacity_bytes),
        fmt_size(st.chunk as u64),
        fmt_size(st.stripe_bytes as u64)
    );
    Ok(())
}

/// `array show`: prints the status table (or JSON), even while another process owns the array.
fn show(array: &Path, json: bool, eng: &EngineArgs) -> Result<()> {
    // A busy array (a background rebuild) is shown from its superblocks at once.
    let opts = ArrayOptions {
        lock_wait: std::time::Duration::from_millis(300),
        ..eng.options()?
    };
    let st = match descriptor::open_array(array, &opts).map_err(anyhow::Error::from) {
        Ok(a) => a.status(),
        Err(e) if is_busy(&e) => offline_status(array)?,
        Err(e) => return Err(e),
    };
    if json {
        println!("{}", serde_json::to_string(&st)?);
    } else {
        print!("{}", render_status(array, &st));
    }
    Ok(())
}

/// `array put`: stores a file (or stdin) as an object.
fn put(array: &Path, key: &str, file: Option<&Path>, eng: &EngineArgs) -> Result<()> {
    let store = ObjectStore::open(open(array, eng)?)?;
    let info = match file {
        Some(f) => {
            let mut r = BufReader::new(
                File::open(f).with_context(|| format!("cannot open {}", f.display()))?,
            );
            store.put(key, &mut r)?
        }
        None => store.put(key, &mut std::io::stdin().lock())?,
    };
    eprintln!("stored {} ({} bytes)", info.name, info.size);
    Ok(())
}

/// `array get`: writes an object to a file (atomically, via a partial file) or to stdout.
fn get(array: &Path, key: &str, file: Option<&Path>, eng: &EngineArgs) -> Result<()> {
    let store = ObjectStore::open(open(array, eng)?)?;
    if store.stat(key)?.is_none() {
        bail!(
            "no object '{key}' in {}: list objects with `tierstack array list`",
            array.display()
        );
    }
    match file {
        Some(f) => {
            let tmp = f.with_extension("tierstack-partial");
            let mut w = BufWriter::new(
                File::create(&tmp).with_context(|| format!("cannot create {}", f.display()))?,
            );
            let r = store
                .get(key, &mut w)
                .map_err(anyhow::Error::from)
                .and_then(|_| Ok(w.flush()?));
            if let Err(e) = r {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            std::fs::rename(&tmp, f)?;
        }
        None => {
            let mut out = BufWriter::new(std::io::stdout().lock());
            store.get(key, &mut out)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// `array delete`: removes an object, failing if there is none by that name.
fn delete(array: &Path, key: &str, eng: &EngineArgs) -> Result<()> {
    let store = ObjectStore::open(open(array, eng)?)?;
    if !store.delete(key)? {
        bail!("no object '{key}' in {}", array.display());
    }
    Ok(())
}

/// `array list`: prints the objects with their sizes (or JSON).
fn list(array: &Path, json: bool, eng: &EngineArgs) -> Result<()> {
    let store = ObjectStore::open(open(array, eng)?)?;
    let list = store.list()?;
    if json {
        let v: Vec<_> = list
            .iter()
            .map(|o| serde_json::json!({"name": o.name, "size": o.size}))
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        for o in list {
            println!("{}\t{}", o.size, o.name);
        }
    }
    Ok(())
}

/// `array fail`: marks a drive failed.
fn fail(array: &Path, drive: usize, eng: &EngineArgs) -> Result<()> {
    let a = open(array, eng)?;
    a.fail_drive(drive)?;
    println!("drive {drive} marked failed; array is {}", a.status().state);
    Ok(())
}

/// `array replace`: swaps in a new drive and rebuilds onto it, here or in the background.
fn replace(
    array: &Path,
    drive: usize,
    newdrive: &Path,
    rate: &Option<String>,
    background: bool,
    eng: &EngineArgs,
) -> Result<()> {
    let rate = parse_rate(rate)?;
    let a = open(array, eng)?;
    a.replace_drive(drive, newdrive)?;
    Descriptor::for_array(&a).save(array)?;
    if background {
        drop(a);
        spawn_background_rebuild(array, rate, eng)?;
        println!("drive {drive} replaced by {}; rebuilding in the background (see `tierstack array show`)", newdrive.display());
        return Ok(());
    }
    rebuild_with_bar(&a, array, rate)?;
    println!("drive {drive} rebuilt; array is {}", a.status().state);
    Ok(())
}

/// `array rebuild`: runs (or resumes) the rebuild of drives in state rebuilding.
fn rebuild(array: &Path, rate: &Option<String>, eng: &EngineArgs) -> Result<()> {
    let rate = parse_rate(rate)?;
    let a = open(array, eng)?;
    rebuild_with_bar(&a, array, rate)?;
    println!("array is {}", a.status().state);
    Ok(())
}

/// `array scrub`: verifies checksums and parity, reports, and fails on errors left.
fn scrub(array: &Path, repair: bool, json: bool, eng: &EngineArgs) -> Result<()> {
    let a = open(array, eng)?;
    let pb = bar(a.geometry().total_stripes(), "scrub");
    if json {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let rep = a.scrub(repair, &|d, _| pb.set_position(d))?;
    pb.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        println!(
            "scrub: {} stripes, {} records checked; {} checksum errors, {} parity errors, {} repaired, {} unrepairable",
            rep.stripes_checked, rep.records_checked, rep.checksum_errors, rep.parity_errors, rep.repaired, rep.unrepairable
        );
    }
    if rep.unrepairable > 0 {
        bail!(
            "scrub found {} stripes it cannot repair: restore those objects from another copy",
            rep.unrepairable
        );
    }
    if !repair && !rep.clean() {
        bail!("scrub found errors: run `tierstack array scrub --repair` to fix them");
    }
    Ok(())
}

/// `array assemble`: rebuilds a lost descriptor from the array's drives.
fn assemble(array: &Path, drives: &[PathBuf], eng: &EngineArgs) -> Result<()> {
    let a = descriptor::assemble(array, drives, &eng.options()?)?;
    let st = a.status();
    println!(
        "assembled RAID {} array {} ({} of {} drives found, {})",
        st.level,
        array.display(),
        st.drives
            .iter()
            .filter(|d| d.state != tierstack_array::DriveState::Failed)
            .count(),
        st.drives_total,
        st.state
    );
    Ok(())
}

fn wipe(paths: &[PathBuf], given: &[PathBuf]) {
    for p in paths.iter().chain(given) {
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(p) {
            use std::os::unix::fs::FileExt;
            let _ = f.write_all_at(&vec![0u8; 8192], 0);
        }
    }
}

fn is_busy(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<ArrayError>(), Some(ArrayError::Busy(_)))
}

fn progress_path(array: &Path) -> PathBuf {
    let mut s = array.as_os_str().to_owned();
    s.push(".rebuild");
    PathBuf::from(s)
}

fn rebuild_with_bar(a: &Array, array: &Path, rate: Option<u64>) -> Result<()> {
    let pb = bar(a.geometry().total_stripes(), "rebuild");
    let prog = progress_path(array);
    let last = std::cell::Cell::new(std::time::Instant::now());
    let res = a.rebuild(rate, &|d, t| {
        pb.set_position(d);
        if last.get().elapsed().as_millis() > 200 || d == t {
            last.set(std::time::Instant::now());
            let _ = std::fs::write(&prog, format!("{d} {t}\n"));
        }
    });
    let _ = std::fs::remove_file(&prog);
    pb.finish_and_clear();
    res?;
    Ok(())
}

fn spawn_background_rebuild(array: &Path, rate: Option<u64>, eng: &EngineArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut log = array.as_os_str().to_owned();
    log.push(".rebuild.log");
    let logf = File::create(PathBuf::from(&log))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("array")
        .arg("rebuild")
        .arg(array)
        .arg("--engine")
        .arg(&eng.engine);
    if let Some(r) = rate {
        cmd.arg("--rate").arg(r.to_string());
    }
    if eng.no_direct {
        cmd.arg("--no-direct");
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .process_group(0);
    cmd.spawn().context("cannot start the background rebuild")?;
    // Wait until the child holds the array, so a following command sees it busy.
    let prog = progress_path(array);
    for _ in 0..200 {
        if prog.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    Ok(())
}

/// Status read from the superblocks while another process owns the array.
fn offline_status(array: &Path) -> Result<ArrayStatus> {
    let d = Descriptor::load(array)?;
    let mut newest: Option<tierstack_array::format::Superblock> = None;
    for p in &d.drives {
        if let Ok(sb) = tierstack_array::array::read_superblock_path(p) {
            if newest.as_ref().is_none_or(|n| sb.generation > n.generation) {
                newest = Some(sb);
            }
        }
    }
    let sb = newest.context("no drive of the array is readable")?;
    let pct = std::fs::read_to_string(progress_path(array))
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
            match (it.next().flatten(), it.next().flatten()) {
                (Some(a), Some(b)) if b > 0.0 => Some(100.0 * a / b),
                _ => None,
            }
        });
    use tierstack_array::DriveState;
    let rebuilding = sb.states.contains(&DriveState::Rebuilding);
    let failed = sb.states.contains(&DriveState::Failed);
    Ok(ArrayStatus {
        uuid: d.uuid.clone(),
        level: sb.level,
        chunk: sb.chunk as usize,
        groups: sb.groups as usize,
        group_size: sb.ndrives as usize / sb.groups.max(1) as usize,
        drives_total: sb.ndrives as usize,
        state: if rebuilding {
            "rebuilding"
        } else if failed {
            "degraded"
        } else {
            "online"
        }
        .into(),
        rebuild_percent: if rebuilding { pct } else { None },
        capacity_bytes: 0,
        used_bytes: 0,
        free_bytes: 0,
        objects: 0,
        segments: sb.nsegs as u64,
        free_segments: 0,
        stripe_bytes: 0,
        write_amplification: 0.0,
        repaired: 0,
        engine: "(busy: owned by another process)".into(),
        direct_io: false,
        generation: sb.generation,
        drives: d
            .drives
            .iter()
            .enumerate()
            .map(|(i, p)| tierstack_array::DriveStatus {
                index: i,
                path: p.display().to_string(),
                state: sb.states.get(i).copied().unwrap_or(DriveState::Failed),
                read_errors: 0,
                write_errors: 0,
                checksum_errors: 0,
            })
            .collect(),
    })
}

/// A status table in the manner of `xicli raid show`.
pub fn render_status(array: &Path, st: &ArrayStatus) -> String {
    let name = array
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let nw = (name.len() + 2).max(10);
    let state = match st.rebuild_percent {
        Some(p) => format!("{} {:.1}%", st.state, p),
        None => st.state.clone(),
    };
    let mut out = String::new();
    out.push_str("RAID:\n");
    out.push_str(&format!(
        "{:<nw$}{:<28}{:<16}{}\n",
        "name",
        "static",
        "state",
        "devices",
        nw = nw
    ));
    let statics = [
        format!("size: {}", fmt_size(st.capacity_bytes)),
        format!("level: {}", st.level),
        format!("group_size: {}", st.group_size),
        format!("groups: {}", st.groups),
        format!("strip_size: {}", st.chunk / 1024),
        format!("stripe: {}", fmt_size(st.stripe_bytes as u64)),
        format!("used: {}", fmt_size(st.used_bytes)),
        format!("free: {}", fmt_size(st.free_bytes)),
        format!("objects: {}", st.objects),
        format!("write_amp: {:.2}", st.write_amplification),
        format!("engine: {}", st.engine),
        format!("o_direct: {}", st.direct_io),
    ];
    let devs: Vec<String> = st
        .drives
        .iter()
        .map(|d| {
            format!(
                "{} {} {:?} r{} w{} c{}",
                d.index, d.path, d.state, d.read_errors, d.write_errors, d.checksum_errors
            )
            .to_lowercase()
        })
        .collect();
    let lines = statics.len().max(devs.len());
    for i in 0..lines {
        let n = if i == 0 { name.as_str() } else { "" };
        let s = statics.get(i).map(|s| s.as_str()).unwrap_or("");
        let stt = if i == 0 { state.as_str() } else { "" };
        let dv = devs.get(i).map(|s| s.as_str()).unwrap_or("");
        let line = format!("{:<nw$}{:<28}{:<16}{}", n, s, stt, dv, nw = nw);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("(devices: index path state r=read errors w=write errors c=checksum errors)\n");
    out
}

pub fn bench(a: BenchArrayArgs) -> Result<()> {
    let level = parse_level(&a.level)?;
    let size = crate::size_flag("size", &a.size)?;
    let chunk = parse_chunk(&a.chunk)?;
    let opts = a.eng.options()?;
    if a.threads == 0 || a.threads > 256 {
        usage_bail!("--threads {} is out of range: use 1 to 256", a.threads);
    }
    let o = tierstack_bench::array::ArrayBenchOpts {
        level,
        drives: a.drives,
        dir: a.dir.clone(),
        size,
        chunk,
        groups: a.groups,
        engine: opts.engine,
        queue_depth: opts.queue_depth,
        threads: a.threads,
        rand_seconds: a.rand_seconds,
        repeat: a.repeat,
    };
    let quiet = a.json;
    let r = tierstack_bench::array::run(&o, &|m| {
        if !quiet {
            eprintln!("... {m}");
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", tierstack_bench::array::render(&r));
    }
    Ok(())
}
