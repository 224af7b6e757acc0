//! The namespace journal and inode table: SQLite (WAL) on the node, next to the fast tier.
//!
//! Every namespace change is one transaction that updates the inode and entry tables and
//! appends one row to `journal`; the drainer replays `journal` to BACKING in `seq` order and
//! deletes each row once it has been applied there.
//!
//! **Operation kinds this version does not know.** A row's `kind` is one of [`OpKind`]'s
//! numbers; a later tierstack may add kinds. Such a row cannot be skipped: the rows after it
//! may depend on it (a path it makes, a rename it does), and a row left in the journal
//! unapplied would count as pending work forever (a mount that never settles, an `umount`
//! that waits for a drain that never comes). Nor can it be quarantined: the quarantine is for
//! rows BACKING refused, and each new mount moves them back into the journal. So, as a file
//! system refuses a feature flag it does not know, [`Db::open`] refuses a journal (or
//! quarantine) holding a row of an unknown kind, before it changes anything in the file: the
//! error is [`crate::error::FsError::Io`] with the database's path, of kind
//! [`std::io::ErrorKind::InvalidData`], whose source is a [`NewerJournal`] (see
//! [`NewerJournal::of`]) that names the row and says what to do: this journal was written by
//! a newer tierstack; upgrade. The rows stay as they are for that newer version. Past
//! [`Db::open`], a reader that meets such a row anyway (a row written behind the daemon's
//! back) fails with an error rather than skip it, so what `count_ops` and `has_ops_after`
//! count is always what the readers return or an error. [`Db::pending`] (read-only, for
//! `buffers`) counts every row whatever its kind: such a journal is never shown drained.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::Result;

/// What a journal row does to BACKING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A directory was made at `p1`.
    Mkdir = 1,
    /// A regular file was created at `p1` (empty; its contents follow in a `Data` row).
    Create = 2,
    /// A symlink was made at `p1`; `p2` is its target.
    Symlink = 3,
    /// A hard link `p2` was added to the node at `p1`.
    Link = 4,
    /// The node at `p1` was renamed to `p2` (replacing what was there).
    Rename = 5,
    /// The name `p1` (not a directory) was removed.
    Unlink = 6,
    /// The empty directory `p1` was removed.
    Rmdir = 7,
    /// The mode, owner or times of the node at `p1` changed; the values come from the inode
    /// when the row is applied.
    SetAttr = 8,
    /// A file's contents are to be written to `p1` (and its further links in `p2`) from the
    /// fast tier; queued when a changed file is closed or truncated (at most one waits per
    /// file).
    Data = 9,
    /// A FIFO, socket or device node: `p2` holds its device number (8 bytes, little
    /// endian); its type, mode and owner come from the inode.
    Mknod = 10,
    /// An extended attribute changed: `p2` is its name; its value (or its absence) comes
    /// from the inode when the row is applied.
    Xattr = 11,
}

impl OpKind {
    /// Every kind, in the order of their numbers.
    pub const ALL: [OpKind; 11] = [
        OpKind::Mkdir,
        OpKind::Create,
        OpKind::Symlink,
        OpKind::Link,
        OpKind::Rename,
        OpKind::Unlink,
        OpKind::Rmdir,
        OpKind::SetAttr,
        OpKind::Data,
        OpKind::Mknod,
        OpKind::Xattr,
    ];

    fn from_i64(v: i64) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::Mkdir,
            2 => OpKind::Create,
            3 => OpKind::Symlink,
            4 => OpKind::Link,
            5 => OpKind::Rename,
            6 => OpKind::Unlink,
            7 => OpKind::Rmdir,
            8 => OpKind::SetAttr,
            9 => OpKind::Data,
            10 => OpKind::Mknod,
            11 => OpKind::Xattr,
            _ => return None,
        })
    }

    /// Ops that move or remove existing paths (or change an existing file) wait until no data
    /// drain is in flight, so that a replay after a crash always finds the paths it recorded.
    pub fn is_barrier(self) -> bool {
        !matches!(
            self,
            OpKind::Mkdir | OpKind::Create | OpKind::Symlink | OpKind::Mknod | OpKind::Data
        )
    }
}

/// One journal row. `p1` is the path (relative to BACKING); `p2` is the second path of a
/// rename or link, the target of a symlink, or the further links of a file (NUL-separated).
#[derive(Debug, Clone)]
pub struct JOp {
    /// The row's place in the journal order (increasing, never reused).
    pub seq: i64,
    /// What the row does.
    pub kind: OpKind,
    /// The inode the row is about.
    pub ino: u64,
    /// The path the row acts on, relative to BACKING.
    pub p1: Vec<u8>,
    /// The second argument (see [`OpKind`]); empty when the kind has none.
    pub p2: Vec<u8>,
}

/// What a journal still holds for BACKING (see [`Db::pending`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// The BACKING the journal belongs to.
    pub backing: Option<PathBuf>,
    /// Its last daemon stopped cleanly (else the journal may lag the array: see `Core::load`).
    pub clean_stop: bool,
    /// Journal rows not applied to BACKING yet.
    pub ops: u64,
    /// Rows BACKING refused (quarantined).
    pub stuck: u64,
    /// Files whose contents differ from BACKING.
    pub dirty_files: u64,
    /// Their sizes in all.
    pub dirty_bytes: u64,
}

impl Pending {
    /// BACKING holds everything (and the last stop was clean, so the journal can be
    /// believed).
    pub fn drained(&self) -> bool {
        self.clean_stop && self.ops == 0 && self.stuck == 0 && self.dirty_files == 0
    }
}

/// A journal row that BACKING refused for good, with its error and when (Unix seconds).
#[derive(Debug, Clone)]
pub struct Stuck {
    /// The journal row.
    pub op: JOp,
    /// The error BACKING gave, as text.
    pub error: String,
    /// When the row was quarantined, in Unix seconds.
    pub since: i64,
}

/// A journal (or quarantine) row of a kind this version does not know: the journal was
/// written by a newer tierstack (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerJournal {
    /// The table the row is in: `journal` or `stuck` (the quarantine).
    pub table: &'static str,
    /// The first such row's `seq`.
    pub seq: i64,
    /// Its `kind`, as SQLite holds it.
    pub kind: String,
    /// How many rows of unknown kinds the table holds (from [`Db::open`]; 1 when a reader
    /// met one).
    pub rows: u64,
}

impl std::fmt::Display for NewerJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "row {} of table `{}` has operation kind {}, which tierstack {} does not know \
             ({} such row(s)): this journal was written by a newer tierstack: upgrade \
             tierstack to mount it and drain it (its rows are kept as they are)",
            self.seq,
            self.table,
            self.kind,
            env!("CARGO_PKG_VERSION"),
            self.rows
        )
    }
}

impl std::error::Error for NewerJournal {}

impl NewerJournal {
    /// The [`NewerJournal`] inside `e`, if that is what `e` is.
    pub fn of(e: &crate::error::FsError) -> Option<&NewerJournal> {
        match e {
            crate::error::FsError::Io { source, .. } => source.get_ref()?.downcast_ref(),
            _ => None,
        }
    }

    /// The first row of an unknown kind in `table` of `conn` (which exists), if any.
    fn find(conn: &Connection, table: &'static str) -> rusqlite::Result<Option<NewerJournal>> {
        let known = OpKind::ALL
            .iter()
            .map(|k| (*k as i64).to_string())
            .collect::<Vec<_>>()
            .join(",");
        // Whatever SQLite holds (NULL, text, a real, another number) is not a known kind
        // unless it is one of the integers.
        let unknown = format!("NOT (typeof(kind) = 'integer' AND kind IN ({known}))");
        let rows: i64 = conn.query_row(
            &format!("SELECT COUNT(*) FROM {table} WHERE {unknown}"),
            [],
            |r| r.get(0),
        )?;
        if rows == 0 {
            return Ok(None);
        }
        conn.query_row(
            &format!("SELECT seq, quote(kind) FROM {table} WHERE {unknown} ORDER BY seq LIMIT 1"),
            [],
            |r| {
                Ok(Some(NewerJournal {
                    table,
                    seq: r.get(0)?,
                    kind: r.get(1)?,
                    rows: rows as u64,
                }))
            },
        )
    }
}

/// A row of `table` (the journal or the quarantine) from its first five columns: seq, kind,
/// ino, p1, p2; an error for a kind this version does not know (never skipped: see the module
/// docs).
fn jop_of(r: &rusqlite::Row, table: &'static str) -> rusqlite::Result<JOp> {
    let seq = r.get::<_, i64>(0)?;
    let raw = r.get::<_, i64>(1)?;
    let Some(kind) = OpKind::from_i64(raw) else {
        return Err(rusqlite::Error::FromSqlConversionFailure(
            1,
            rusqlite::types::Type::Integer,
            Box::new(NewerJournal {
                table,
                seq,
                kind: raw.to_string(),
                rows: 1,
            }),
        ));
    };
    Ok(JOp {
        seq,
        kind,
        ino: r.get::<_, i64>(2)? as u64,
        p1: r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
        p2: r.get::<_, Option<Vec<u8>>>(4)?.unwrap_or_default(),
    })
}

/// An extended attribute: (inode, name, value).
pub type XattrRow = (u64, Vec<u8>, Vec<u8>);

/// One inode row.
#[derive(Debug, Clone, Default)]
pub struct InodeRow {
    /// Inode number.
    pub ino: u64,
    /// The node's type (a [`crate::core::Kind`] as its number).
    pub kind: u8,
    /// Permission, set-ID and sticky bits.
    pub mode: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Last access time, in nanoseconds since the epoch.
    pub atime: i64,
    /// Last modification time, in nanoseconds since the epoch.
    pub mtime: i64,
    /// Last status change time, in nanoseconds since the epoch.
    pub ctime: i64,
    /// A symlink's target or a special node's device number (8 bytes, little endian).
    pub target: Option<Vec<u8>>,
    /// The object id keying a regular file's pages in the store (0 for other kinds).
    pub obj: u64,
    /// The file has a base in BACKING.
    pub has_base: bool,
    /// Bytes of the base that are the file's contents.
    pub base_len: u64,
    /// The node's path in BACKING as of the journal rows applied so far.
    pub bpath: Option<Vec<u8>>,
    /// A directory's entries in BACKING have been listed into the namespace.
    pub loaded: bool,
    /// The file's contents differ from BACKING.
    pub dirty: bool,
    /// Where a file's drain stages its contents while it is still being written (a
    /// temporary name in BACKING holding the first `base_len` bytes).
    pub staged: Option<Vec<u8>>,
    /// The file's allocated ranges (`core::extents::Extents::encode`); None: unknown (a
    /// file found in BACKING and not changed since).
    pub extents: Option<Vec<u8>>,
}

/// The journal database: one SQLite connection, in WAL mode.
pub struct Db {
    /// The connection; every access of the mount goes through it.
    pub conn: Connection,
    /// Since when a group transaction has been open (see [`Db::begin_group`]).
    group: Option<std::time::Instant>,
    /// The journal's last `seq` when the open group began: rows after it are the group's
    /// own, not committed, unseen by the drainer (see [`Db::own_last_row`]).
    group_seq: i64,
    /// Raised while a group transaction is open (rows may be written and not committed);
    /// shared with whoever reads the journal through a [`DbReader`], which does not see
    /// them (see [`Db::uncommitted_flag`]).
    uncommitted: Arc<AtomicBool>,
    /// Where the database is (for [`Db::reader`]).
    path: PathBuf,
}

/// A second connection to a mount's journal database, for `status` only: in WAL mode it
/// reads the last committed state without waiting for the mount's connection (which the
/// drainer and the committer hold while they work), so a Prometheus scrape of a busy mount
/// does not queue behind them. What a group transaction has not committed yet (a few
/// milliseconds of operations) is not counted.
pub struct DbReader {
    conn: Connection,
}

impl DbReader {
    /// Rows in the journal (not counting the quarantine).
    pub fn count_ops(&self) -> Result<u64> {
        count_ops_on(&self.conn)
    }

    /// The quarantined rows, oldest first.
    pub fn stuck(&self) -> Result<Vec<Stuck>> {
        stuck_on(&self.conn)
    }
}

fn count_ops_on(conn: &Connection) -> Result<u64> {
    Ok(conn.query_row("SELECT COUNT(*) FROM journal", [], |r| r.get::<_, i64>(0))? as u64)
}

fn stuck_on(conn: &Connection) -> Result<Vec<Stuck>> {
    let mut st =
        conn.prepare_cached("SELECT seq, kind, ino, p1, p2, error, since FROM stuck ORDER BY seq")?;
    let rows = st.query_map([], |r| {
        let error = r.get::<_, Option<String>>(5)?.unwrap_or_default();
        let since = r.get::<_, i64>(6)?;
        Ok(Stuck {
            op: jop_of(r, "stuck")?,
            error,
            since,
        })
    })?;
    Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
}

impl Db {
    /// Opens (or creates) the database at `path`, creating missing tables and columns.
    /// Refuses a journal that holds a row of an operation kind this version does not know,
    /// before changing anything in it: an [`FsError::Io`](crate::error::FsError::Io) whose
    /// source is a [`NewerJournal`] (see the module docs).
    pub fn open(path: &Path) -> Result<Db> {
        let conn = Connection::open(path)?;
        for table in ["journal", "stuck"] {
            let exists = conn
                .prepare("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?1")?
                .exists([table])?;
            if let Some(newer) = exists
                .then(|| NewerJournal::find(&conn, table))
                .transpose()?
                .flatten()
            {
                return Err(crate::error::FsError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, newer),
                });
            }
        }
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v BLOB);
             CREATE TABLE IF NOT EXISTS inodes(ino INTEGER PRIMARY KEY, kind INTEGER, mode INTEGER,
                uid INTEGER, gid INTEGER, size INTEGER, atime INTEGER, mtime INTEGER, ctime INTEGER,
                target BLOB, obj INTEGER, has_base INTEGER, base_len INTEGER, bpath BLOB,
                loaded INTEGER, dirty INTEGER);
             CREATE TABLE IF NOT EXISTS dentries(parent INTEGER, name BLOB, ino INTEGER,
                PRIMARY KEY(parent, name));
             CREATE TABLE IF NOT EXISTS journal(seq INTEGER PRIMARY KEY AUTOINCREMENT,
                kind INTEGER, ino INTEGER, p1 BLOB, p2 BLOB);
             CREATE INDEX IF NOT EXISTS journal_ino ON journal(ino, seq);
             CREATE TABLE IF NOT EXISTS xattrs(ino INTEGER, name BLOB, value BLOB,
                PRIMARY KEY(ino, name));
             CREATE TABLE IF NOT EXISTS stuck(seq INTEGER PRIMARY KEY, kind INTEGER,
                ino INTEGER, p1 BLOB, p2 BLOB, error TEXT, since INTEGER);
             CREATE TABLE IF NOT EXISTS staging(path BLOB PRIMARY KEY, ino INTEGER);",
        )?;
        // Journals made before staged drains lack the column.
        let has_staged = conn.prepare("SELECT staged FROM inodes LIMIT 0").is_ok();
        if !has_staged {
            conn.execute_batch("ALTER TABLE inodes ADD COLUMN staged BLOB;")?;
        }
        // ... and before allocation tracking, the extents.
        if conn.prepare("SELECT extents FROM inodes LIMIT 0").is_err() {
            conn.execute_batch("ALTER TABLE inodes ADD COLUMN extents BLOB;")?;
        }
        Ok(Db {
            conn,
            group: None,
            group_seq: i64::MAX,
            uncommitted: Arc::new(AtomicBool::new(false)),
            path: path.to_path_buf(),
        })
    }

    /// A [`DbReader`] of this database (a connection of its own).
    pub fn reader(&self) -> Result<DbReader> {
        let conn = Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Ok(DbReader { conn })
    }

    /// What the journal at `path` says is still to reach BACKING, read without changing it
    /// (a daemon may hold it open).
    pub fn pending(path: &Path) -> Result<Pending> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
        let meta = |k: &str| -> Result<Option<Vec<u8>>> {
            Ok(conn
                .query_row("SELECT v FROM meta WHERE k=?1", [k], |r| r.get(0))
                .optional()?)
        };
        Ok(Pending {
            backing: meta("backing")?.map(|b| PathBuf::from(std::ffi::OsString::from_vec(b))),
            clean_stop: meta("clean")?.is_some_and(|v| v == b"1"),
            ops: count("SELECT COUNT(*) FROM journal")? as u64,
            stuck: count("SELECT COUNT(*) FROM stuck")? as u64,
            dirty_files: count("SELECT COUNT(*) FROM inodes WHERE dirty=1")? as u64,
            dirty_bytes: count("SELECT COALESCE(SUM(size), 0) FROM inodes WHERE dirty=1")? as u64,
        })
    }

    /// The value of key `k` in the `meta` table, if set.
    pub fn meta_get(&self, k: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .conn
            .query_row("SELECT v FROM meta WHERE k=?1", [k], |r| r.get(0))
            .optional()?)
    }

    /// Sets key `k` of the `meta` table to `v`.
    pub fn meta_set(&self, k: &str, v: &[u8]) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO meta(k, v) VALUES (?1, ?2)",
            params![k, v],
        )?;
        Ok(())
    }

    /// The generation of every node of this fast tier but the root (see
    /// [`crate::attr::Attr::generation`]): drawn once, not 0, when the database is new (or
    /// first opened by a version that hands out generations) and kept in the `meta` table.
    /// Inode numbers are never reused within one database ([`INO_NEXT`]), so the pair
    /// (inode, generation) names one node for as long as the database lives, across daemon
    /// restarts; a new fast tier draws another, and a handle of the old one is stale there.
    pub fn generation(&self) -> Result<u32> {
        let kept = self
            .meta_get(GENERATION)?
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(u32::from_le_bytes)
            .filter(|g| *g != 0);
        if let Some(g) = kept {
            return Ok(g);
        }
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        let g = (h.finish() as u32).max(1);
        self.meta_set(GENERATION, &g.to_le_bytes())?;
        Ok(g)
    }

    /// The inode numbers below which some may have been handed out ([`INO_NEXT`]; 0 if
    /// none recorded).
    pub fn ino_next(&self) -> Result<u64> {
        Ok(self
            .meta_get(INO_NEXT)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_le_bytes))
    }

    /// Every inode row.
    pub fn load_inodes(&self) -> Result<Vec<InodeRow>> {
        let mut st = self.conn.prepare(
            "SELECT ino, kind, mode, uid, gid, size, atime, mtime, ctime, target, obj, has_base,
                    base_len, bpath, loaded, dirty, staged, extents FROM inodes",
        )?;
        let rows = st.query_map([], |r| {
            Ok(InodeRow {
                ino: r.get::<_, i64>(0)? as u64,
                kind: r.get::<_, i64>(1)? as u8,
                mode: r.get::<_, i64>(2)? as u32,
                uid: r.get::<_, i64>(3)? as u32,
                gid: r.get::<_, i64>(4)? as u32,
                size: r.get::<_, i64>(5)? as u64,
                atime: r.get(6)?,
                mtime: r.get(7)?,
                ctime: r.get(8)?,
                target: r.get(9)?,
                obj: r.get::<_, i64>(10)? as u64,
                has_base: r.get::<_, i64>(11)? != 0,
                base_len: r.get::<_, i64>(12)? as u64,
                bpath: r.get(13)?,
                loaded: r.get::<_, i64>(14)? != 0,
                dirty: r.get::<_, i64>(15)? != 0,
                staged: r.get(16)?,
                extents: r.get(17)?,
            })
        })?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Every directory entry: (parent inode, name, inode).
    pub fn load_dentries(&self) -> Result<Vec<(u64, Vec<u8>, u64)>> {
        let mut st = self
            .conn
            .prepare("SELECT parent, name, ino FROM dentries")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, i64>(2)? as u64,
            ))
        })?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Every extended attribute.
    pub fn load_xattrs(&self) -> Result<Vec<XattrRow>> {
        let mut st = self.conn.prepare("SELECT ino, name, value FROM xattrs")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, Option<Vec<u8>>>(2)?.unwrap_or_default(),
            ))
        })?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Journal rows after `seq`, oldest first.
    pub fn ops_after(&self, seq: i64, limit: usize) -> Result<Vec<JOp>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, kind, ino, p1, p2 FROM journal WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )?;
        let rows = st.query_map(params![seq, limit as i64], |r| jop_of(r, "journal"))?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Moves journal row `op` to the quarantine with the error BACKING gave.
    pub fn quarantine(&mut self, op: &JOp, error: &str) -> Result<()> {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let tx = self.conn.savepoint()?;
        tx.execute(
            "INSERT OR REPLACE INTO stuck(seq, kind, ino, p1, p2, error, since)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                op.seq,
                op.kind as i64,
                op.ino as i64,
                op.p1,
                op.p2,
                error,
                since
            ],
        )?;
        tx.execute("DELETE FROM journal WHERE seq=?1", [op.seq])?;
        tx.commit()?;
        Ok(())
    }

    /// The quarantined rows, oldest first.
    pub fn stuck(&self) -> Result<Vec<Stuck>> {
        stuck_on(&self.conn)
    }

    /// Moves every quarantined row back into the journal (at its old place in the order).
    pub fn release_stuck(&mut self) -> Result<usize> {
        let tx = self.conn.savepoint()?;
        let n = tx.execute(
            "INSERT OR IGNORE INTO journal(seq, kind, ino, p1, p2)
             SELECT seq, kind, ino, p1, p2 FROM stuck",
            [],
        )?;
        tx.execute("DELETE FROM stuck", [])?;
        tx.commit()?;
        Ok(n)
    }

    /// Whether the journal has rows after row `seq`.
    pub fn has_ops_after(&self, seq: i64) -> Result<bool> {
        let mut st = self
            .conn
            .prepare_cached("SELECT 1 FROM journal WHERE seq > ?1 LIMIT 1")?;
        Ok(st.exists([seq])?)
    }

    /// The journal rows of inode `ino` after row `seq`, in order.
    pub fn ops_of(&self, ino: u64, seq: i64) -> Result<Vec<JOp>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, kind, ino, p1, p2 FROM journal WHERE ino=?1 AND seq > ?2 ORDER BY seq",
        )?;
        let rows = st.query_map(params![ino as i64, seq], |r| jop_of(r, "journal"))?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Deletes journal rows `seqs` in one transaction.
    pub fn del_ops(&mut self, seqs: &[i64]) -> Result<()> {
        let tx = self.conn.savepoint()?;
        {
            let mut st = tx.prepare_cached("DELETE FROM journal WHERE seq=?1")?;
            for s in seqs {
                st.execute([s])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Deletes journal row `seq` (it was applied to BACKING).
    pub fn del_op(&self, seq: i64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM journal WHERE seq=?1")?
            .execute([seq])?;
        Ok(())
    }

    /// Records that the drainer is about to make a temporary file at `path` in BACKING for
    /// inode `ino` (see [`Db::staging_files`]).
    pub fn staging_add(&self, path: &[u8], ino: u64) -> Result<()> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO staging(path, ino) VALUES (?1, ?2)")?
            .execute(params![path, ino as i64])?;
        Ok(())
    }

    /// Every temporary file the drainer recorded and has not yet found gone or in use.
    pub fn staging_files(&self) -> Result<Vec<(Vec<u8>, u64)>> {
        let mut st = self
            .conn
            .prepare_cached("SELECT path, ino FROM staging ORDER BY path")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Forgets the temporary file at `path`.
    pub fn staging_del(&self, path: &[u8]) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM staging WHERE path=?1")?
            .execute([path])?;
        Ok(())
    }

    /// Rows in the journal (not counting the quarantine).
    pub fn count_ops(&self) -> Result<u64> {
        count_ops_on(&self.conn)
    }

    /// Opens a group transaction unless one is open: the namespace operations that follow
    /// (each in a savepoint of its own, see `Core::tx`) share one commit. A group is
    /// committed within a few milliseconds (`Core::tx`, the mount's committer thread), and
    /// before anything is made durable ([`Db::make_durable`]) or handed to the drainer.
    /// Returns whether it opened one.
    pub fn begin_group(&mut self) -> Result<bool> {
        if self.group.is_some() {
            return Ok(false);
        }
        self.conn.execute_batch("BEGIN")?;
        self.group_seq = self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM journal")?
            .query_row([], |r| r.get(0))?;
        self.group = Some(std::time::Instant::now());
        self.uncommitted.store(true, Ordering::SeqCst);
        Ok(true)
    }

    /// Commits the open group transaction, if any.
    pub fn commit_group(&mut self) -> Result<()> {
        if self.group.is_some() {
            self.conn.execute_batch("COMMIT")?;
            self.group = None;
            self.group_seq = i64::MAX;
            self.uncommitted.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Runs `f` in a savepoint: all of what it writes, or none of it (rolled back when `f`
    /// fails or panics), inside the open group if there is one. The savepoint statements are
    /// prepared once and cached: parsing them anew for every namespace operation (what
    /// `Connection::savepoint` does) cost a tenth of the daemon's time in a create loop.
    pub fn in_savepoint<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        /// Rolls the savepoint back unless disarmed (an error or a panic in `f`).
        struct Undo<'a>(&'a Connection, bool);
        impl Drop for Undo<'_> {
            fn drop(&mut self) {
                if self.1 {
                    return;
                }
                for sql in ["ROLLBACK TO op", "RELEASE op"] {
                    if let Err(e) = self.0.prepare_cached(sql).and_then(|mut s| s.execute([])) {
                        tracing::warn!("undoing a journal operation ({sql}): {e}");
                    }
                }
            }
        }
        self.conn.prepare_cached("SAVEPOINT op")?.execute([])?;
        let mut undo = Undo(&self.conn, false);
        let v = f(&self.conn)?;
        self.conn.prepare_cached("RELEASE op")?.execute([])?;
        undo.1 = true;
        Ok(v)
    }

    /// The journal's last row (kind, node, path) if the open group wrote it: not committed,
    /// so the drainer has not read it and will apply it after whatever the group does next.
    pub fn own_last_row(&self) -> Result<Option<(OpKind, u64, Vec<u8>)>> {
        if self.group.is_none() {
            return Ok(None);
        }
        let row: Option<(i64, i64, i64, Vec<u8>)> = self
            .conn
            .prepare_cached("SELECT seq, kind, ino, p1 FROM journal ORDER BY seq DESC LIMIT 1")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()?;
        Ok(row
            .filter(|(seq, ..)| *seq > self.group_seq)
            .and_then(|(_, k, ino, p1)| Some((OpKind::from_i64(k)?, ino as u64, p1))))
    }

    /// The flag raised while a group transaction is open: a [`DbReader`] that counts no row
    /// cannot tell an empty journal from one whose rows are not committed yet while it is up.
    pub fn uncommitted_flag(&self) -> Arc<AtomicBool> {
        self.uncommitted.clone()
    }

    /// How long the open group transaction has been open.
    pub fn group_age(&self) -> Option<std::time::Duration> {
        self.group.map(|t| t.elapsed())
    }

    /// Commits the open group and makes everything committed durable (an fsync of the
    /// database's WAL).
    pub fn make_durable(&mut self) -> Result<()> {
        self.commit_group()?;
        self.conn.execute_batch(
            "PRAGMA synchronous=FULL;
             INSERT OR REPLACE INTO meta(k, v) VALUES ('sync', randomblob(8));
             PRAGMA synchronous=NORMAL;",
        )?;
        Ok(())
    }
}

/// Writes inode row `r` (inserted or replaced).
pub fn put_inode(tx: &Connection, r: &InodeRow) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO inodes(ino, kind, mode, uid, gid, size, atime, mtime, ctime, target,
            obj, has_base, base_len, bpath, loaded, dirty, staged, extents)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
    )?
    .execute(params![
        r.ino as i64,
        r.kind as i64,
        r.mode as i64,
        r.uid as i64,
        r.gid as i64,
        r.size as i64,
        r.atime,
        r.mtime,
        r.ctime,
        r.target,
        r.obj as i64,
        r.has_base as i64,
        r.base_len as i64,
        r.bpath,
        r.loaded as i64,
        r.dirty as i64,
        r.staged,
        r.extents,
    ])?;
    Ok(())
}

/// The `meta` key of the fast tier's node generation ([`Db::generation`]).
const GENERATION: &str = "generation";

/// The `meta` key of the inode numbers reserved so far: numbers below it may have been
/// handed out (and the node removed since), so a restart never hands them out again, and a
/// file handle of a removed node never names a new one. Raised in blocks ([`set_ino_next`]
/// in the transaction that takes the first number past it), not at every create.
pub const INO_NEXT: &str = "ino_next";

/// Records in `tx` that inode numbers below `next` may be in use ([`INO_NEXT`]).
pub fn set_ino_next(tx: &Connection, next: u64) -> Result<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO meta(k, v) VALUES (?1, ?2)")?
        .execute(params![INO_NEXT, &next.to_le_bytes()[..]])?;
    Ok(())
}

/// Deletes the inode row of `ino` and its extended attributes.
pub fn del_inode(tx: &Connection, ino: u64) -> Result<()> {
    tx.prepare_cached("DELETE FROM inodes WHERE ino=?1")?
        .execute([ino as i64])?;
    tx.prepare_cached("DELETE FROM xattrs WHERE ino=?1")?
        .execute([ino as i64])?;
    Ok(())
}

/// Sets (Some) or removes (None) extended attribute `name` of `ino`.
pub fn put_xattr(tx: &Connection, ino: u64, name: &[u8], value: Option<&[u8]>) -> Result<()> {
    match value {
        Some(v) => tx
            .prepare_cached("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?1, ?2, ?3)")?
            .execute(params![ino as i64, name, v])?,
        None => tx
            .prepare_cached("DELETE FROM xattrs WHERE ino=?1 AND name=?2")?
            .execute(params![ino as i64, name])?,
    };
    Ok(())
}

/// Enters `ino` as `name` in directory `parent` (replacing an entry of that name).
pub fn add_dentry(tx: &Connection, parent: u64, name: &[u8], ino: u64) -> Result<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO dentries(parent, name, ino) VALUES (?1, ?2, ?3)")?
        .execute(params![parent as i64, name, ino as i64])?;
    Ok(())
}

/// Removes entry `name` from directory `parent`.
pub fn del_dentry(tx: &Connection, parent: u64, name: &[u8]) -> Result<()> {
    tx.prepare_cached("DELETE FROM dentries WHERE parent=?1 AND name=?2")?
        .execute(params![parent as i64, name])?;
    Ok(())
}

/// Appends a journal row (its `seq` is the next one).
pub fn push_op(tx: &Connection, kind: OpKind, ino: u64, p1: &[u8], p2: &[u8]) -> Result<()> {
    tx.prepare_cached("INSERT INTO journal(kind, ino, p1, p2) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![kind as i64, ino as i64, p1, p2])?;
    Ok(())
}

/// Records the node's path in BACKING (`None`: it is not there).
pub fn set_bpath(tx: &Connection, ino: u64, bpath: Option<&[u8]>) -> Result<()> {
    tx.prepare_cached("UPDATE inodes SET bpath=?2 WHERE ino=?1")?
        .execute(params![ino as i64, bpath])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of a kind this version does not know, in the journal or the quarantine, or a
    /// kind that is no number at all: the journal is refused, typed, with the fix named.
    #[test]
    fn a_journal_with_an_unknown_kind_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, (table, kind)) in [
            ("journal", "12"),
            ("journal", "NULL"),
            ("journal", "'2'"),
            ("journal", "2.5"),
            ("stuck", "0"),
        ]
        .into_iter()
        .enumerate()
        {
            let p = dir.path().join(format!("j{i}.db"));
            let db = Db::open(&p).expect("open");
            db.in_savepoint(|tx| push_op(tx, OpKind::Mkdir, 2, b"a", b""))
                .expect("op");
            db.conn
                .execute_batch(&format!(
                    "INSERT INTO {table}(seq, kind, ino, p1, p2) VALUES (7, {kind}, 3, x'62', x'');"
                ))
                .expect("insert");
            // The reader meets it: an error, not fewer rows.
            let read = if table == "journal" {
                db.ops_after(0, 10).map(|v| v.len())
            } else {
                db.stuck().map(|v| v.len())
            };
            if kind == "'2'" {
                // Stored as the integer 2 (the column's affinity): a known kind.
                assert_eq!(read.expect("read"), 2);
                drop(db);
                Db::open(&p).expect("a known kind");
                continue;
            }
            assert!(read.is_err(), "{table} {kind}");
            drop(db);
            let e = Db::open(&p).err().expect("refused");
            let newer = NewerJournal::of(&e).expect("typed");
            assert_eq!((newer.table, newer.seq, newer.rows), (table, 7, 1));
            assert!(e.to_string().contains("upgrade"), "{e}");
        }
    }

    /// Only a row the open group wrote is its own: none before a group, none of an earlier
    /// (committed) group, none once the group's last row was deleted again.
    #[test]
    fn the_last_row_is_the_groups_own_only_until_it_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut db = Db::open(&dir.path().join("j.db")).expect("open");
        assert_eq!(db.own_last_row().expect("read"), None);
        db.begin_group().expect("begin");
        assert_eq!(db.own_last_row().expect("read"), None);
        db.in_savepoint(|tx| push_op(tx, OpKind::Create, 2, b"a", b""))
            .expect("op");
        assert_eq!(
            db.own_last_row().expect("read"),
            Some((OpKind::Create, 2, b"a".to_vec()))
        );
        db.commit_group().expect("commit");
        assert_eq!(db.own_last_row().expect("read"), None);
        db.begin_group().expect("begin");
        assert_eq!(
            db.own_last_row().expect("read"),
            None,
            "the last group's row"
        );
        db.in_savepoint(|tx| push_op(tx, OpKind::SetAttr, 3, b"b", b""))
            .expect("op");
        assert_eq!(
            db.own_last_row().expect("read"),
            Some((OpKind::SetAttr, 3, b"b".to_vec()))
        );
        let seq: i64 = db
            .conn
            .query_row("SELECT MAX(seq) FROM journal", [], |r| r.get(0))
            .expect("seq");
        db.del_op(seq).expect("delete");
        assert_eq!(db.own_last_row().expect("read"), None, "an older row");
        db.commit_group().expect("commit");
    }

    /// An operation that fails leaves nothing of itself, and the group's earlier operations
    /// stay; one that succeeds is kept; a panic inside one rolls it back too.
    #[test]
    fn a_failed_operation_leaves_nothing_and_keeps_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut db = Db::open(&dir.path().join("j.db")).expect("open");
        db.begin_group().expect("begin");
        db.in_savepoint(|tx| push_op(tx, OpKind::Create, 2, b"a", b""))
            .expect("first op");
        let failed: Result<()> = db.in_savepoint(|tx| {
            push_op(tx, OpKind::Create, 3, b"b", b"")?;
            Err(crate::error::FsError::Config("refused".into()))
        });
        assert!(failed.is_err());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = db.in_savepoint(|tx| -> Result<()> {
                push_op(tx, OpKind::Create, 4, b"c", b"")?;
                panic!("inside an operation");
            });
        }));
        assert!(panicked.is_err());
        db.in_savepoint(|tx| push_op(tx, OpKind::Create, 5, b"d", b""))
            .expect("last op");
        db.commit_group().expect("commit");
        let inos: Vec<u64> = db
            .ops_after(0, 100)
            .expect("ops")
            .iter()
            .map(|o| o.ino)
            .collect();
        assert_eq!(inos, [2, 5]);
    }

    /// `status`'s reader counts the committed rows while the mount's connection holds an
    /// open group transaction (it does not wait for it), and the rows of that group once it
    /// commits.
    #[test]
    fn the_reader_counts_committed_rows_without_waiting_for_a_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut db = Db::open(&dir.path().join("j.db")).expect("open");
        db.begin_group().expect("begin");
        db.in_savepoint(|tx| push_op(tx, OpKind::Create, 2, b"a", b""))
            .expect("op");
        db.commit_group().expect("commit");
        let r = db.reader().expect("reader");
        db.begin_group().expect("begin");
        db.in_savepoint(|tx| push_op(tx, OpKind::Create, 3, b"b", b""))
            .expect("op");
        let t = std::time::Instant::now();
        assert_eq!(
            r.count_ops().expect("count"),
            1,
            "the open group is not counted"
        );
        assert!(r.stuck().expect("stuck").is_empty());
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "waited");
        db.commit_group().expect("commit");
        assert_eq!(r.count_ops().expect("count"), 2);
        assert_eq!(db.count_ops().expect("count"), 2);
    }
}
