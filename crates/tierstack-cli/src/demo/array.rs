//! The demo's array part: a RAID 5 of five file drives in the demo's folder, objects stored
//! and read back, a drive failed and read degraded, replaced and rebuilt, bytes flipped and
//! repaired by scrub, `array show`, then `bench array`'s table.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use rand::RngCore;
use tierstack_array::descriptor::Descriptor;
use tierstack_array::objects::ObjectStore;
use tierstack_array::{Array, ArrayOptions, CreateParams, Level};
use tierstack_bench::fmt_size;

use super::{step, Outcome};

pub fn part(dir: &Path, size: u64) -> Result<Outcome> {
    let dir = dir.join("array");
    std::fs::create_dir_all(&dir)?;
    super::commands(&[
        format!("tierstack array create /tmp/a.array --level 5 --chunk 64K --size {}M /tmp/d0 /tmp/d1 /tmp/d2 /tmp/d3 /tmp/d4", size >> 20),
        "tierstack array put /tmp/a.array large ./file     # durable when it returns".into(),
        "tierstack array fail /tmp/a.array --drive 2".into(),
        "tierstack array get /tmp/a.array large ./copy     # read degraded".into(),
        "tierstack array replace /tmp/a.array --drive 2 /tmp/d2-new".into(),
        "tierstack array scrub /tmp/a.array --repair".into(),
        "tierstack array show /tmp/a.array".into(),
        format!("tierstack bench array --level 5 --drives 5 --dir /tmp/bench --size {}M", size >> 20),
    ]);
    let drives: Vec<PathBuf> = (0..5).map(|i| dir.join(format!("drive{i}.img"))).collect();
    let desc = dir.join("demo.array");
    let opts = ArrayOptions::default();
    step(&format!(
        "create RAID 5 over 5 file drives of {} in {}",
        fmt_size(size),
        dir.display()
    ));
    let params = CreateParams {
        level: Level::Raid5,
        chunk: 64 << 10,
        groups: None,
        size: Some(size),
    };
    let a = Array::create(&drives, &params, &opts)?;
    Descriptor::for_array(&a).save(&desc)?;
    let store = ObjectStore::open(a)?;
    step("store objects of 0 B, 1 KiB, 3 MiB and 48 MiB, flush, read back");
    let mut rng = rand::thread_rng();
    let mut objs = Vec::new();
    for (name, len) in [
        ("empty", 0usize),
        ("small", 1024),
        ("medium", 3 << 20),
        ("large", 48 << 20),
    ] {
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        store.put(name, &mut v.as_slice())?;
        objs.push((name, v));
    }
    let verify = |store: &ObjectStore, what: &str| -> Result<()> {
        for (name, v) in &objs {
            let mut out = Vec::new();
            store.get(name, &mut out)?;
            if &out != v {
                bail!("{what}: object {name} read back wrong");
            }
        }
        println!("   {} objects read back byte-exact ({what})", objs.len());
        Ok(())
    };
    verify(&store, "healthy")?;
    step("fail drive 2 and read degraded");
    store.array().fail_drive(2)?;
    println!("   array state: {}", store.array().status().state);
    verify(&store, "degraded, reconstructed from parity")?;
    step("replace drive 2 with a new file and rebuild");
    let spare = dir.join("drive2-new.img");
    store.array().replace_drive(2, &spare)?;
    let t = std::time::Instant::now();
    let bytes = store.array().rebuild(None, &|_, _| {})?;
    println!(
        "   rebuilt {} in {:.2}s; array state: {}",
        fmt_size(bytes),
        t.elapsed().as_secs_f64(),
        store.array().status().state
    );
    Descriptor::for_array(store.array()).save(&desc)?;
    verify(&store, "after rebuild")?;
    step("flip bytes inside drive 1, scrub --repair, scrub again");
    let a = store.array().clone();
    drop(store);
    let paths = a.drive_paths();
    // Stripe 8 holds part of the 48 MiB object.
    let at = (1u64 << 20) + 8 * a.geometry().stripe_drive_bytes() as u64;
    drop(a);
    corrupt(&paths[1], at)?;
    let a = tierstack_array::descriptor::open_array(&desc, &opts)?;
    let rep = a.scrub(true, &|_, _| {})?;
    println!(
        "   scrub --repair: {} checksum errors, {} parity errors, {} repaired",
        rep.checksum_errors, rep.parity_errors, rep.repaired
    );
    let rep2 = a.scrub(false, &|_, _| {})?;
    println!("   second scrub clean: {}", rep2.clean());
    if !rep2.clean() {
        bail!("scrub did not repair the corruption");
    }
    step("array show");
    print!("{}", crate::array_cmd::render_status(&desc, &a.status()));
    drop(a);
    step("tierstack bench array --level 5 --drives 5 (drives in the same folder)");
    let o = tierstack_bench::array::ArrayBenchOpts {
        level: Level::Raid5,
        drives: 5,
        dir: dir.join("bench"),
        size,
        chunk: 64 << 10,
        groups: None,
        engine: opts.engine,
        queue_depth: opts.queue_depth,
        threads: 4,
        rand_seconds: 1.0,
        repeat: 1,
    };
    let r = tierstack_bench::array::run(&o, &|m| eprintln!("   ... {m}"))?;
    print!("{}", tierstack_bench::array::render(&r));
    let _ = std::fs::remove_dir_all(dir.join("bench"));
    Ok(Outcome::Done)
}

/// Overwrites 256 KiB of a drive at `at` (data and parity chunks) with garbage.
fn corrupt(path: &std::path::Path, at: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    let garbage = vec![0xA5u8; 256 << 10];
    f.write_all_at(&garbage, at)?;
    f.sync_all()?;
    Ok(())
}
