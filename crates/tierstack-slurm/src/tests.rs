//! Unit tests of the hooks' pieces that need no SLURM: the job state file, job ids, quoting
//! for the files `install` writes, the `scontrol show job` field, `install`/`uninstall` in a
//! temporary configuration folder, what the TaskProlog prints for a task's environment. The hooks against a real SLURM are tested through the
//! binary (crates/tierstack-cli/tests/cli_slurm.rs).

use std::path::PathBuf;

use proptest::prelude::*;

use crate::directives::Mode;
use crate::install::{lua_quote, Settings};
use crate::node::burst_buffer_field;
use crate::state::{check_job_id, load_state_at, save_state, JobState};
use crate::SlurmError;

fn path_strategy() -> impl Strategy<Value = PathBuf> {
    "/[a-z0-9 _.\"-]{0,20}".prop_map(PathBuf::from)
}

proptest! {
    /// What `save_state` writes, `load_state_at` reads back field for field.
    #[test]
    fn state_file_round_trips(
        uid in 1u32..u32::MAX, gid in 0u32..u32::MAX, capacity in 0u64..u64::MAX / 2,
        asynch in any::<bool>(),
        stage_in in proptest::collection::vec(path_strategy(), 0..4),
        stage_out in proptest::collection::vec(path_strategy(), 0..4),
        manifest in proptest::option::of(path_strategy()),
        backing in path_strategy(),
        state in "[a-z-]{1,12}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = JobState {
            uid, gid, capacity,
            mode: if asynch { Mode::Async } else { Mode::Sync },
            stage_in, stage_out, manifest, backing, state,
        };
        save_state(dir.path(), &s).unwrap();
        let back = load_state_at(dir.path()).unwrap();
        prop_assert_eq!(format!("{s:?}"), format!("{back:?}"));
    }
}

#[test]
fn a_damaged_state_file_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.json"), b"{\"uid\": 5").unwrap();
    let e = load_state_at(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("is damaged") && e.contains("cancel the job"),
        "{e}"
    );
    std::fs::write(dir.path().join("state.json"), b"{\"uid\": 5}").unwrap();
    let e = load_state_at(dir.path()).unwrap_err().to_string();
    assert!(e.contains("is damaged: cancel the job"), "{e}");
    let none = dir.path().join("42");
    let e = load_state_at(&none).unwrap_err().to_string();
    assert!(e.contains("job 42 has no tierstack buffer"), "{e}");
}

#[test]
fn job_ids_are_numbers() {
    for ok in ["1", "4294967296", "00012"] {
        assert!(check_job_id(ok).is_ok(), "{ok}");
    }
    for bad in ["", "12a", "../1", "1/2", "123456789012345678901", "-1"] {
        let e = check_job_id(bad).unwrap_err().to_string();
        assert!(e.contains("is not a number"), "{bad}: {e}");
    }
}

#[test]
fn lua_strings_are_quoted() {
    assert_eq!(lua_quote("plain"), "\"plain\"");
    assert_eq!(lua_quote("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
}

#[test]
fn the_burst_buffer_field_of_scontrol_show_job() {
    let text = "JobId=7 JobName=x\n   BurstBuffer=#BB_LUA node_local=1G\n#BB_LUA stage_out=/o\n   Power=\n#BB_LUA not=this\n";
    assert_eq!(
        burst_buffer_field(text),
        "#BB_LUA node_local=1G\n#BB_LUA stage_out=/o\n"
    );
    assert_eq!(burst_buffer_field("JobId=7\n"), "");
}

fn settings<'a>(
    conf: &'a std::path::Path,
    fast: &'a std::path::Path,
    pool: &'a str,
) -> Settings<'a> {
    Settings {
        conf,
        fast,
        pool,
        stage_timeout: 600,
        other_timeout: 300,
        drain_rate: Some(200.0),
    }
}

#[test]
fn install_writes_its_files_and_uninstall_removes_only_them() {
    let conf = tempfile::tempdir().unwrap();
    let fast = tempfile::tempdir().unwrap();
    std::fs::write(conf.path().join("slurm.conf"), "ClusterName=t\n").unwrap();
    crate::install(&settings(conf.path(), fast.path(), "2G")).unwrap();
    let lua = std::fs::read_to_string(conf.path().join("burst_buffer.lua")).unwrap();
    assert!(
        lua.contains(&format!("\"{}\"", 2u64 << 30)),
        "pool size in bytes"
    );
    assert!(!lua.contains("@FAST_DIR@") && lua.contains(&*fast.path().to_string_lossy()));
    let prolog = std::fs::read_to_string(conf.path().join("tierstack_prolog.sh")).unwrap();
    assert!(prolog.contains("--drain-rate 200"), "{prolog}");
    assert!(fast.path().join("jobs").is_dir());
    crate::uninstall(conf.path()).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(conf.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["slurm.conf"]);
}

#[test]
fn install_refuses_bad_settings_and_writes_nothing() {
    let conf = tempfile::tempdir().unwrap();
    let fast = tempfile::tempdir().unwrap();
    let bad_size = crate::install(&settings(conf.path(), fast.path(), "2X")).unwrap_err();
    assert!(matches!(bad_size, SlurmError::Usage(_)), "{bad_size}");
    let small = crate::install(&settings(conf.path(), fast.path(), "512K")).unwrap_err();
    assert!(small.to_string().contains("smaller than 1M"), "{small}");
    let rel = crate::install(&settings(conf.path(), std::path::Path::new("rel"), "2G"));
    assert!(rel.unwrap_err().to_string().contains("is not absolute"));
    assert_eq!(std::fs::read_dir(conf.path()).unwrap().count(), 0);
}

/// What the TaskProlog prints for a task's environment, without a mount or SLURM.
#[test]
fn task_prolog_exports_for_a_live_buffer_only() {
    use crate::task::{exports, TaskEnv};
    use std::path::Path;
    let live = |d: &Path| -> Result<(PathBuf, PathBuf), String> {
        Ok((d.to_path_buf(), PathBuf::from("/run/tierstack/ab12.io")))
    };
    let lib = || -> Result<PathBuf, String> { Ok(PathBuf::from("/usr/lib/libtierstack_io.so")) };
    let never_socket = |_: &Path| -> Result<(PathBuf, PathBuf), String> { panic!("asked") };
    let never_lib = || -> Result<PathBuf, String> { panic!("asked") };
    let job = |dir: Option<&str>, off: Option<&str>| TaskEnv {
        dir: dir.map(Into::into),
        off: off.map(Into::into),
        ..TaskEnv::default()
    };
    // No buffer, an empty one, or the job opted out: nothing, nothing looked up.
    for env in [
        job(None, None),
        job(Some(""), None),
        job(Some("/f/jobs/7/mnt"), Some("1")),
        job(Some("/f/jobs/7/mnt"), Some("yes")),
    ] {
        assert_eq!(exports(&env, never_socket, never_lib), Ok(None), "{env:?}");
    }
    // A live buffer: both variables, the client first, what the task had kept after it; not
    // added again to a task started from one already under the client (srun in the batch
    // script).
    let printed = |off: Option<&str>, preload: Option<&str>, io: Option<&str>| {
        let env = TaskEnv {
            preload: preload.map(Into::into),
            io: io.map(Into::into),
            ..job(Some("/f/jobs/7/mnt"), off)
        };
        String::from_utf8(exports(&env, live, lib).unwrap().unwrap()).unwrap()
    };
    let alone = "export LD_PRELOAD=/usr/lib/libtierstack_io.so\n\
                 export TIERSTACK_IO=/f/jobs/7/mnt=/run/tierstack/ab12.io\n";
    for off in [None, Some("0"), Some("")] {
        assert_eq!(printed(off, None, None), alone);
    }
    assert_eq!(
        printed(None, Some("/opt/x.so"), Some("/other=/run/o.io")),
        "export LD_PRELOAD=/usr/lib/libtierstack_io.so:/opt/x.so\n\
         export TIERSTACK_IO=/f/jobs/7/mnt=/run/tierstack/ab12.io:/other=/run/o.io\n"
    );
    assert_eq!(
        printed(
            None,
            Some("/usr/lib/libtierstack_io.so"),
            Some("/f/jobs/7/mnt=/run/tierstack/ab12.io")
        ),
        alone
    );
    // Problems are warnings (stderr), never lines: a dead mount, no library, a path the
    // variables cannot carry.
    let env = job(Some("/f/jobs/7/mnt"), None);
    let dead = |_: &Path| -> Result<(PathBuf, PathBuf), String> { Err("no mount".into()) };
    assert_eq!(exports(&env, dead, never_lib), Err("no mount".into()));
    let nolib = || -> Result<PathBuf, String> { Err("no lib".into()) };
    assert_eq!(exports(&env, live, nolib), Err("no lib".into()));
    let e = exports(&job(Some("/f/a:b"), None), live, lib).unwrap_err();
    assert!(e.contains("the mountpoint /f/a:b"), "{e}");
    let env = TaskEnv {
        preload: Some("/a.so\nexport X=1".into()),
        ..job(Some("/f/jobs/7/mnt"), None)
    };
    assert!(exports(&env, live, lib).unwrap_err().contains("line break"));
}
