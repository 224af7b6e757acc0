//! The namespace operations the FUSE layer calls: lookup, readdir, mkdir, create, mknod,
//! symlink, link, unlink, rename, setattr, xattrs, open and release, each written through to
//! the journal; directories listed from BACKING on first use; the set-ID rules.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

/// A direct handle whose file was last written this long after its open gets its entries
/// dropped at close (a jiffy at 250 Hz, the kernel clock's granularity for file times).
pub const STALE_NS: i64 = 4_000_000;

use parking_lot::Mutex;

use crate::backing::Backing;
use crate::db::{self, OpKind};

use super::{
    check_name, eio, join_rel, now_ns, ns_of, row_of, transient_name, Attr, Core, Counts, FileData,
    Kind, Node, Ns, Seen, NAME_MAX, R, ROOT,
};
use tierstack_ioproto::vers;

/// How old a BACKING folder's times must be before an unchanged pair is taken to mean that
/// nothing was added since the last listing (`Core::refresh_dir`): file systems that keep
/// times in whole seconds, and clocks of different nodes a little apart.
pub const STAMP_SLACK_NS: i64 = 3_000_000_000;

/// How long before a direct handle's open the kernel's cached mtime of the file may lie: the
/// create's time, or the kernel's coarse clock at an `O_TRUNC` open (a few jiffies).
pub const KERNEL_COPY_NS: i64 = 50_000_000;

impl Core {
    /// How long after a look at a loaded directory's folder in BACKING the next may pick up
    /// other writers' names (`mount --coherence`; zero: never, the mount is then the only
    /// writer it knows of).
    pub fn set_coherence(&self, every: std::time::Duration) {
        self.coherence_ns
            .store(i64::try_from(every.as_nanos()).unwrap_or(i64::MAX), Relaxed);
    }

    /// How long the kernel may keep a name's absence (a negative entry): the coherence
    /// interval, so that a name another writer adds is seen within it; an hour when the
    /// mount looks for no other writer.
    pub fn negative_ttl(&self) -> std::time::Duration {
        match self.coherence_ns.load(Relaxed) {
            n if n > 0 => std::time::Duration::from_nanos(n as u64),
            _ => std::time::Duration::from_secs(3600),
        }
    }

    /// Lists a directory from BACKING the first time it is used.
    pub(super) fn ensure_loaded(&self, ns: &mut Ns, dir: u64) -> R<()> {
        let (loaded, bpath, kind) = match ns.nodes.get(&dir) {
            Some(n) => (n.loaded, n.bpath.clone(), n.kind),
            None => return Err(libc::ENOENT),
        };
        if kind != Kind::Dir {
            return Err(libc::ENOTDIR);
        }
        if loaded {
            return Ok(());
        }
        let mut new: Vec<(u64, Vec<u8>, Node)> = Vec::new();
        if let Some(bp) = &bpath {
            let stamp = self.backing_stamp(bp);
            if let Some(d) = self.backing_dir(bp)? {
                new = self.listed(ns, dir, bp, &d, |_| false)?;
            }
            ns.seen.insert(
                dir,
                Seen {
                    checked_ns: now_ns(),
                    stamp,
                },
            );
        }
        self.enter_listed(ns, dir, new)
    }

    /// The folder `bp` in BACKING, opened; None where it is not there (a directory made
    /// here and not drained yet).
    fn backing_dir(&self, bp: &[u8]) -> R<Option<OwnedFd>> {
        match self.bk.dir(bp) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(eio(format!("{}: {e}", self.bjoin(bp).display()))),
        }
    }

    /// The modification and change times (ns) of folder `bp` in BACKING: what changes when
    /// a name is added there or removed (None: not there, or not readable).
    fn backing_stamp(&self, bp: &[u8]) -> Option<(i64, i64)> {
        let d = self.bk.dir(bp).ok()?;
        let md = rustix::fs::fstat(&d).ok()?;
        Some((
            md.st_mtime * 1_000_000_000 + md.st_mtime_nsec as i64,
            md.st_ctime * 1_000_000_000 + md.st_ctime_nsec as i64,
        ))
    }

    /// New nodes for the names of BACKING's folder `d` (directory `dir`, at `bp`), except
    /// staging files, names too long and those `skip` says are known; each gets an inode
    /// number (and a store object, for files) from `ns`.
    fn listed(
        &self,
        ns: &mut Ns,
        dir: u64,
        bp: &[u8],
        d: &OwnedFd,
        skip: impl Fn(&[u8]) -> bool,
    ) -> R<Vec<(u64, Vec<u8>, Node)>> {
        let names =
            Backing::list(d).map_err(|e| eio(format!("{}: {e}", self.bjoin(bp).display())))?;
        let mut new = Vec::new();
        for name in names {
            if transient_name(&name) || name.len() > NAME_MAX || skip(&name) {
                continue;
            }
            let Ok(md) = Backing::stat(d, &name) else {
                continue;
            };
            let Some(kind) = Kind::of_mode(md.st_mode) else {
                continue;
            };
            let target = if kind == Kind::Symlink {
                Backing::readlink(d, &name).unwrap_or_default()
            } else if kind.is_special() {
                md.st_rdev.to_le_bytes().to_vec()
            } else {
                Vec::new()
            };
            let md_len = md.st_size as u64;
            let xattrs: BTreeMap<Vec<u8>, Vec<u8>> = if kind == Kind::Symlink {
                BTreeMap::new()
            } else {
                Backing::xattrs(d, &name)
                    .unwrap_or_default()
                    .into_iter()
                    .collect()
            };
            let ino = ns.next_ino;
            ns.next_ino += 1;
            let obj = if kind == Kind::File {
                ns.next_obj += 1;
                ns.next_obj - 1
            } else {
                0
            };
            let rel = join_rel(bp, &name);
            let data = (kind == Kind::File).then(|| {
                Arc::new(Mutex::new(FileData {
                    size: md_len,
                    has_base: true,
                    base_len: md_len,
                    bpath: Some(rel.clone()),
                    min_size: md_len,
                    base_blocks: md.st_blocks as u64,
                    ..Default::default()
                }))
            });
            let node = Node {
                kind,
                mode: md.st_mode & 0o7777,
                uid: md.st_uid,
                gid: md.st_gid,
                atime: md.st_atime * 1_000_000_000 + md.st_atime_nsec as i64,
                mtime: md.st_mtime * 1_000_000_000 + md.st_mtime_nsec as i64,
                ctime: md.st_ctime * 1_000_000_000 + md.st_ctime_nsec as i64,
                size: match kind {
                    Kind::Symlink => target.len() as u64,
                    k if k.is_special() => 0,
                    _ => md_len,
                },
                target,
                links: vec![(dir, name.clone())],
                obj,
                bpath: Some(rel),
                loaded: false,
                children: BTreeMap::new(),
                subdirs: 0,
                listed_nlink: if kind == Kind::Dir {
                    md.st_nlink as u32
                } else {
                    0
                },
                xattrs,
                open: 0,
                open_w: 0,
                direct_mtime: 0,
                direct_opened: 0,
                direct_first: 0,
                kernel_stale: false,
                data,
            };
            new.push((ino, name, node));
        }
        Ok(new)
    }

    /// Enters listed nodes `new` into directory `dir` (journal first, then the namespace)
    /// and marks the directory loaded.
    fn enter_listed(&self, ns: &mut Ns, dir: u64, new: Vec<(u64, Vec<u8>, Node)>) -> R<()> {
        let dir_row = {
            let n = ns.nodes.get(&dir).ok_or(libc::ENOENT)?;
            let mut r = row_of(dir, n, None);
            r.loaded = true;
            r
        };
        let reserve = ns.reserve_ino(ns.next_ino);
        self.tx(|tx| {
            if let Some(r) = reserve {
                db::set_ino_next(tx, r)?;
            }
            for (ino, name, node) in &new {
                let f = node.data.as_ref().map(|d| d.lock());
                db::put_inode(tx, &row_of(*ino, node, f.as_deref()))?;
                db::add_dentry(tx, dir, name, *ino)?;
                for (k, v) in &node.xattrs {
                    db::put_xattr(tx, *ino, k, Some(v))?;
                }
            }
            db::put_inode(tx, &dir_row)
        })
        .map_err(eio)?;
        if let Some(r) = reserve {
            ns.ino_reserved = r;
        }
        for (ino, name, node) in new {
            if let Some(b) = &node.bpath {
                ns.paths.note(b, ino);
            }
            ns.nodes.insert(ino, node);
            ns.insert_child(dir, name, ino);
        }
        if let Some(d) = ns.nodes.get_mut(&dir) {
            d.loaded = true;
        }
        Ok(())
    }

    /// Picks up the names that others (other nodes' buffers draining into the same shared
    /// file system, or anyone writing there directly) added to loaded directory `dir`'s
    /// folder in BACKING since this mount last looked: at most once per coherence interval
    /// ([`Core::set_coherence`]) per directory, only when the folder's modification or
    /// change time moved or is less than [`STAMP_SLACK_NS`] old, and only while this mount has nothing waiting to drain and nothing
    /// quarantined (else a name it removed but has not removed from BACKING yet would come
    /// back). Names that others removed, and other writers' changes to files this mount
    /// already knows, are not picked up (docs/ARCHITECTURE.md, "Coherence between nodes").
    pub(super) fn refresh_dir(&self, ns: &mut Ns, dir: u64) -> R<()> {
        let every = self.coherence_ns.load(Relaxed);
        let Some(n) = ns.nodes.get(&dir) else {
            return Ok(());
        };
        if every <= 0 || n.kind != Kind::Dir || !n.loaded {
            return Ok(());
        }
        let Some(bp) = n.bpath.clone() else {
            return Ok(());
        };
        let now = now_ns();
        let last = ns.seen.get(&dir).copied();
        if last.is_some_and(|s| now - s.checked_ns < every) {
            return Ok(());
        }
        let known = last.and_then(|s| s.stamp);
        ns.seen.insert(
            dir,
            Seen {
                checked_ns: now,
                stamp: known,
            },
        );
        let stamp = self.backing_stamp(&bp);
        // A folder's times may tick in whole seconds (MooseFS, NFSv3 servers): a name added
        // in the second of the last listing leaves them as they were, so an unchanged stamp
        // is trusted only once it is [`STAMP_SLACK_NS`] old.
        let recent = stamp.is_some_and(|(m, c)| now - m.max(c) < STAMP_SLACK_NS);
        if stamp.is_none() || (stamp == known && !recent) {
            return Ok(());
        }
        let pending = self.lock_db().has_ops_after(0).unwrap_or(true);
        if pending || !self.stuck_inos.lock().is_empty() {
            // Looked at again next interval: the stamp stays the one last listed.
            return Ok(());
        }
        let Some(d) = self.backing_dir(&bp)? else {
            return Ok(());
        };
        let new = {
            let have = ns.nodes.get(&dir).map(|n| &n.children);
            let have: std::collections::HashSet<Vec<u8>> = have
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default();
            self.listed(ns, dir, &bp, &d, |name| have.contains(name))?
        };
        if !new.is_empty() {
            tracing::debug!(
                "{}: {} names from other writers",
                self.bjoin(&bp).display(),
                new.len()
            );
            self.enter_listed(ns, dir, new)?;
        }
        if let Some(s) = ns.seen.get_mut(&dir) {
            s.stamp = stamp;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ FUSE operations

    /// The attributes of `ino` (ENOENT if the mount does not know it).
    pub fn getattr(&self, ino: u64) -> R<Attr> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(self.attr_of(ino, n))
    }

    /// Whether `ino` is a directory of the namespace.
    pub fn is_dir(&self, ino: u64) -> bool {
        self.ns
            .lock()
            .nodes
            .get(&ino)
            .is_some_and(|n| n.kind == Kind::Dir)
    }

    /// The attributes of `name` in directory `parent`, listing the directory from BACKING
    /// first if it was not yet.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> R<Attr> {
        check_name(name)?;
        let mut ns = self.ns.lock();
        let ino = self.lookup_in(&mut ns, parent, name)?;
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(self.attr_of(ino, n))
    }

    /// As [`Core::lookup`], with the change counts its answer rests on, each read before
    /// its fact (see `tierstack_ioproto::vers`): the slot and count of the name's outcome
    /// (the names `parent` lost when it is there, the names it gained when it is not), then
    /// the node's counts.
    pub fn lookup_v(&self, parent: u64, name: &[u8]) -> ((u32, u64), R<(Attr, Counts)>) {
        let (lost, gained) = (vers::lost_slot(parent), vers::gained_slot(parent));
        if let Err(e) = check_name(name) {
            return ((gained, 0), Err(e));
        }
        let mut ns = self.ns.lock();
        let (lost_n, gained_n) = (self.count(lost), self.count(gained));
        match self.lookup_in(&mut ns, parent, name) {
            Ok(ino) => ((lost, lost_n), self.counted(&ns, ino)),
            Err(e) => ((gained, gained_n), Err(e)),
        }
    }

    /// As [`Core::getattr`], with the node's counts read before its attributes.
    pub fn getattr_v(&self, ino: u64) -> R<(Attr, Counts)> {
        let ns = self.ns.lock();
        self.counted(&ns, ino)
    }

    /// `ino`'s counts, then its attributes (under the namespace lock).
    fn counted(&self, ns: &Ns, ino: u64) -> R<(Attr, Counts)> {
        let c = Counts::new(
            self.count(vers::attr_slot(ino)),
            self.count(vers::perm_slot(ino)),
        );
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok((self.attr_of(ino, n), c))
    }

    fn count(&self, slot: u32) -> u64 {
        self.vers.as_ref().map_or(0, |(v, _)| v.get(slot))
    }

    /// Raises the counts of `ino`'s attributes, and with `perm` of who may walk through it.
    pub fn changed(&self, ino: u64, perm: bool) {
        if let Some((v, _)) = &self.vers {
            v.bump(vers::attr_slot(ino));
            if perm {
                v.bump(vers::perm_slot(ino));
            }
        }
    }

    /// The descriptor of the change counters, for a client to map (None: there are none).
    pub fn versions_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.vers.as_ref().map(|(_, fd)| fd.as_fd())
    }

    /// The node `name` names in `parent` (under the namespace lock).
    fn lookup_in(&self, ns: &mut Ns, parent: u64, name: &[u8]) -> R<u64> {
        // "." and "..": the kernel asks for them only to find a node from a file handle (an
        // NFS export): "." is the node itself, of any kind, ".." the directory holding its
        // first name (the root's is the root). A node the mount does not know (any more) is
        // ESTALE, which the kernel hands on as a stale handle.
        if name == b"." || name == b".." {
            let n = ns.nodes.get(&parent).ok_or(libc::ESTALE)?;
            let ino = match (name, n.links.first()) {
                (b".", _) => parent,
                (_, Some(l)) => l.0,
                (_, None) if parent == ROOT => ROOT,
                (_, None) => return Err(libc::ESTALE),
            };
            return if ns.nodes.contains_key(&ino) {
                Ok(ino)
            } else {
                Err(libc::ESTALE)
            };
        }
        self.ensure_loaded(ns, parent)?;
        match ns.child(parent, name) {
            Some(ino) => Ok(ino),
            None => {
                // Perhaps another writer's, drained into the shared folder since.
                self.refresh_dir(ns, parent)?;
                ns.child(parent, name).ok_or(libc::ENOENT)
            }
        }
    }

    /// A symlink's target (EINVAL for any other kind).
    pub fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        if n.kind != Kind::Symlink {
            return Err(libc::EINVAL);
        }
        Ok(n.target.clone())
    }

    /// Entries of a directory from position `off` (0: ".", 1: "..", then children).
    pub fn readdir(&self, ino: u64, off: u64) -> R<Vec<(u64, Kind, Vec<u8>)>> {
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, ino)?;
        if off == 0 {
            self.refresh_dir(&mut ns, ino)?;
        }
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let parent = n.links.first().map_or(ROOT, |l| l.0);
        let mut out = Vec::new();
        if off == 0 {
            out.push((ino, Kind::Dir, b".".to_vec()));
        }
        if off <= 1 {
            out.push((parent, Kind::Dir, b"..".to_vec()));
        }
        let skip = off.saturating_sub(2) as usize;
        for (name, c) in n.children.iter().skip(skip).take(4096) {
            let kind = ns.nodes.get(c).map_or(Kind::File, |cn| cn.kind);
            out.push((*c, kind, name.clone()));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_node(
        &self,
        ns: &mut Ns,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: u32,
        uid: u32,
        gid: u32,
        target: Vec<u8>,
        op: OpKind,
    ) -> R<(u64, Attr)> {
        check_name(name)?;
        self.ensure_loaded(ns, parent)?;
        // A set-group-ID directory hands its group to what is made in it, and its set-GID
        // bit to the directories made in it (as ext4 does).
        let (mut mode, mut gid) = (mode, gid);
        if let Some(p) = ns
            .nodes
            .get(&parent)
            .filter(|p| p.mode & libc::S_ISGID != 0)
        {
            gid = p.gid;
            if kind == Kind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        if ns
            .nodes
            .get(&parent)
            .is_some_and(|p| p.children.contains_key(name))
        {
            return Err(libc::EEXIST);
        }
        // A directory's default ACL becomes the new node's access ACL (masked by the mode it
        // is created with, which the ACL masks in turn) and a new directory's default ACL.
        let mut xattrs = BTreeMap::new();
        if kind != Kind::Symlink {
            if let Some(def) = ns
                .nodes
                .get(&parent)
                .and_then(|p| p.xattrs.get(&b"system.posix_acl_default"[..]))
                .cloned()
            {
                let mut m = mode & 0o7777;
                if let Some(access) = acl_create_masq(&def, &mut m) {
                    xattrs.insert(b"system.posix_acl_access".to_vec(), access);
                }
                mode = (mode & !0o777) | (m & 0o777);
                if kind == Kind::Dir {
                    xattrs.insert(b"system.posix_acl_default".to_vec(), def);
                }
            }
        }
        let path = Self::child_path(ns, parent, name)?;
        let ino = ns.next_ino;
        let obj = if kind == Kind::File { ns.next_obj } else { 0 };
        let t = now_ns();
        let data = (kind == Kind::File).then(|| {
            Arc::new(Mutex::new(FileData {
                dirty: true,
                extents: Some(super::extents::Extents::new()),
                ..Default::default()
            }))
        });
        let node = Node {
            kind,
            mode: mode & 0o7777,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
            size: match kind {
                Kind::Dir => 4096,
                Kind::Symlink => target.len() as u64,
                _ => 0,
            },
            target: target.clone(),
            links: vec![(parent, name.to_vec())],
            obj,
            bpath: None,
            loaded: true,
            children: BTreeMap::new(),
            subdirs: 0,
            listed_nlink: 0,
            xattrs,
            open: 0,
            open_w: 0,
            direct_mtime: 0,
            direct_opened: 0,
            direct_first: 0,
            kernel_stale: false,
            data,
        };
        let row = {
            let f = node.data.as_ref().map(|d| d.lock());
            row_of(ino, &node, f.as_deref())
        };
        let reserve = ns.reserve_ino(ino + 1);
        let p2 = if op == OpKind::Mknod {
            // The node's type goes with the device number: the drain makes the node even
            // when it is gone from the namespace by then (a later rename or link row of it
            // must find it in BACKING; its removal row follows).
            let mut p2 = target.clone();
            p2.resize(8, 0);
            p2.extend_from_slice(&kind.mode_bits().to_le_bytes());
            p2
        } else {
            target.clone()
        };
        let xattrs = node.xattrs.clone();
        let name_owned = name.to_vec();
        self.tx_later(move |tx| {
            if let Some(r) = reserve {
                db::set_ino_next(tx, r)?;
            }
            db::put_inode(tx, &row)?;
            db::add_dentry(tx, parent, &name_owned, ino)?;
            db::push_op(tx, op, ino, &path, &p2)?;
            for (k, v) in &xattrs {
                db::put_xattr(tx, ino, k, Some(v))?;
                db::push_op(tx, OpKind::Xattr, ino, &path, k)?;
            }
            Ok(())
        })
        .map_err(eio)?;
        if let Some(r) = reserve {
            ns.ino_reserved = r;
        }
        ns.next_ino += 1;
        if kind == Kind::File {
            ns.next_obj += 1;
        }
        let attr = self.attr_of(ino, &node);
        ns.nodes.insert(ino, node);
        ns.insert_child(parent, name.to_vec(), ino);
        if let Some(p) = ns.nodes.get_mut(&parent) {
            p.mtime = t;
            p.ctime = t;
        }
        self.wake_drainer();
        Ok((ino, attr))
    }

    /// Makes directory `name` in `parent` for `uid` and `gid` (a set-group-ID parent gives its
    /// group and that bit), and journals a mkdir row.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> R<Attr> {
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            Kind::Dir,
            mode,
            uid,
            gid,
            Vec::new(),
            OpKind::Mkdir,
        )
        .map(|r| r.1)
    }

    /// Creates a file (and opens it when `open`).
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        open: bool,
    ) -> R<Attr> {
        let mut ns = self.ns.lock();
        let (ino, attr) = self.new_node(
            &mut ns,
            parent,
            name,
            Kind::File,
            mode,
            uid,
            gid,
            Vec::new(),
            OpKind::Create,
        )?;
        if let Some(n) = ns.nodes.get_mut(&ino) {
            if open {
                n.open += 1;
                n.open_w += 1;
            }
        }
        if !open {
            self.queue_data(&ns, ino).map_err(eio)?;
        }
        Ok(attr)
    }

    /// Makes symlink `name` in `parent` pointing at `target`, and journals a symlink row.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> R<Attr> {
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            Kind::Symlink,
            0o777,
            uid,
            gid,
            target.to_vec(),
            OpKind::Symlink,
        )
        .map(|r| r.1)
    }

    /// Whether directory `dir` has a default ACL.
    pub fn has_default_acl(&self, dir: u64) -> bool {
        self.ns
            .lock()
            .nodes
            .get(&dir)
            .is_some_and(|n| n.xattrs.contains_key(&b"system.posix_acl_default"[..]))
    }

    /// Extended attribute `name` of `ino` (ENODATA when it has none of that name).
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        n.xattrs.get(name).cloned().ok_or(libc::ENODATA)
    }

    /// The names of `ino`'s extended attributes, each followed by a NUL.
    pub fn listxattr(&self, ino: u64) -> R<Vec<u8>> {
        let ns = self.ns.lock();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let mut out = Vec::new();
        for k in n.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    /// Sets (`value` Some, with XATTR_CREATE/XATTR_REPLACE `flags`) or removes (None) an
    /// extended attribute; journaled and drained to BACKING like any namespace change.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: Option<&[u8]>, flags: i32) -> R<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(libc::ERANGE);
        }
        if !crate::backing::xattr_kept(name) {
            return Err(libc::EOPNOTSUPP);
        }
        if value.is_some_and(|v| v.len() > 65536) {
            return Err(libc::E2BIG);
        }
        let mut ns = self.ns.lock();
        let path = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
        let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        let exists = n.xattrs.contains_key(name);
        match value {
            Some(_) if flags & libc::XATTR_CREATE != 0 && exists => return Err(libc::EEXIST),
            Some(_) if flags & libc::XATTR_REPLACE != 0 && !exists => return Err(libc::ENODATA),
            None if !exists => return Err(libc::ENODATA),
            _ => {}
        }
        // An access ACL sets the permission bits it stands for (owner, mask or group, other).
        let new_mode = value
            .filter(|_| name == b"system.posix_acl_access")
            .and_then(acl_mode)
            .map(|bits| (n.mode & !0o777) | bits);
        let row = new_mode.map(|m| {
            let mut r = row_of(ino, n, n.data.as_ref().map(|d| d.lock()).as_deref());
            r.mode = m;
            r
        });
        self.tx(|tx| {
            db::put_xattr(tx, ino, name, value)?;
            db::push_op(tx, OpKind::Xattr, ino, &path, name)?;
            if let Some(r) = &row {
                db::put_inode(tx, r)?;
                db::push_op(tx, OpKind::SetAttr, ino, &path, &[])?;
            }
            Ok(())
        })
        .map_err(eio)?;
        if let Some(m) = new_mode {
            n.mode = m;
        }
        match value {
            Some(v) => {
                n.xattrs.insert(name.to_vec(), v.to_vec());
            }
            None => {
                n.xattrs.remove(name);
            }
        }
        n.ctime = now_ns();
        self.wake_drainer();
        Ok(())
    }

    /// Makes a FIFO, socket or device node (`mode` holds the type bits).
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> R<Attr> {
        let kind = Kind::of_mode(mode)
            .filter(|k| k.is_special())
            .ok_or(libc::EINVAL)?;
        let rdev = if matches!(kind, Kind::CharDev | Kind::BlockDev) {
            rdev
        } else {
            0
        };
        let mut ns = self.ns.lock();
        self.new_node(
            &mut ns,
            parent,
            name,
            kind,
            mode,
            uid,
            gid,
            rdev.to_le_bytes().to_vec(),
            OpKind::Mknod,
        )
        .map(|r| r.1)
    }

    /// Adds hard link `newname` in `newparent` to `ino` (EPERM for a directory), and journals
    /// a link row.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> R<Attr> {
        check_name(newname)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, newparent)?;
        {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            if n.kind == Kind::Dir {
                return Err(libc::EPERM);
            }
        }
        if ns
            .nodes
            .get(&newparent)
            .is_some_and(|p| p.children.contains_key(newname))
        {
            return Err(libc::EEXIST);
        }
        let src = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
        let dst = Self::child_path(&ns, newparent, newname)?;
        let name_owned = newname.to_vec();
        self.tx_later(move |tx| {
            db::add_dentry(tx, newparent, &name_owned, ino)?;
            db::push_op(tx, OpKind::Link, ino, &src, &dst)
        })
        .map_err(eio)?;
        let t = now_ns();
        if let Some(n) = ns.nodes.get_mut(&ino) {
            n.links.push((newparent, newname.to_vec()));
            n.ctime = t;
        }
        ns.insert_child(newparent, newname.to_vec(), ino);
        if let Some(p) = ns.nodes.get_mut(&newparent) {
            p.mtime = t;
            p.ctime = t;
        }
        self.wake_drainer();
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(self.attr_of(ino, n))
    }

    /// Removes the link (parent, name) of `ino`; the node goes when nothing refers to it.
    /// Returns the DB work to do in the caller's transaction.
    pub(super) fn unlink_node(&self, ns: &mut Ns, parent: u64, name: &[u8], ino: u64) -> R<bool> {
        // A base in BACKING stays where it is until the drainer applies this removal there;
        // it copies the base into the fast tier first if the file lives on (`pin_base`).
        let (remaining, open) = {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            (n.links.len().saturating_sub(1), n.open)
        };
        if let Some(n) = ns.nodes.get_mut(&ino) {
            if let Some(i) = n.links.iter().position(|l| l.0 == parent && l.1 == name) {
                n.links.remove(i);
            }
            n.ctime = now_ns();
        }
        ns.remove_child(parent, name);
        if let Some(p) = ns.nodes.get_mut(&parent) {
            // As ext4: a removed entry changes its directory's mtime and ctime.
            let t = now_ns();
            p.mtime = t;
            p.ctime = t;
        }
        Ok(remaining == 0 && open == 0)
    }

    /// Removes `name` from `parent`: an empty directory when `dir` (rmdir), any other kind
    /// otherwise (unlink). Journals the row first; the node goes once it has no link and no
    /// open handle.
    pub fn unlink(&self, parent: u64, name: &[u8], dir: bool) -> R<()> {
        check_name(name)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, parent)?;
        let ino = ns.child(parent, name).ok_or(libc::ENOENT)?;
        let kind = ns.nodes.get(&ino).map(|n| n.kind).ok_or(libc::ENOENT)?;
        if dir {
            if kind != Kind::Dir {
                return Err(libc::ENOTDIR);
            }
            self.ensure_loaded(&mut ns, ino)?;
            if ns.nodes.get(&ino).is_some_and(|n| !n.children.is_empty()) {
                return Err(libc::ENOTEMPTY);
            }
        } else if kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        let path = Self::child_path(&ns, parent, name)?;
        // Write the journal first: if it fails nothing has changed.
        let gone_if_unlinked = ns
            .nodes
            .get(&ino)
            .is_some_and(|n| n.links.len() <= 1 && n.open == 0);
        let name_owned = name.to_vec();
        self.tx_later(move |tx| {
            db::del_dentry(tx, parent, &name_owned)?;
            db::push_op(
                tx,
                if dir { OpKind::Rmdir } else { OpKind::Unlink },
                ino,
                &path,
                &[],
            )?;
            if gone_if_unlinked {
                db::del_inode(tx, ino)?;
            }
            Ok(())
        })
        .map_err(eio)?;
        let gone = self.unlink_node(&mut ns, parent, name, ino)?;
        if gone {
            self.destroy(&mut ns, ino);
        }
        self.wake_drainer();
        Ok(())
    }

    /// Renames `name` in `parent` to `newname` in `newparent`, replacing what is there
    /// (`RENAME_NOREPLACE` in `flags`: EEXIST instead; `RENAME_EXCHANGE` is not supported),
    /// and journals a rename row.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> R<()> {
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(libc::EINVAL);
        }
        check_name(name)?;
        check_name(newname)?;
        let mut ns = self.ns.lock();
        self.ensure_loaded(&mut ns, parent)?;
        self.ensure_loaded(&mut ns, newparent)?;
        let src = ns.child(parent, name).ok_or(libc::ENOENT)?;
        let existing = ns.child(newparent, newname);
        if existing == Some(src) {
            return Ok(());
        }
        let src_kind = ns.nodes.get(&src).map(|n| n.kind).ok_or(libc::ENOENT)?;
        if src_kind == Kind::Dir {
            // Not into itself or a descendant.
            let mut cur = newparent;
            loop {
                if cur == src {
                    return Err(libc::EINVAL);
                }
                if cur == ROOT {
                    break;
                }
                cur = ns
                    .nodes
                    .get(&cur)
                    .and_then(|n| n.links.first())
                    .map_or(ROOT, |l| l.0);
            }
        }
        if let Some(e) = existing {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            let ek = ns.nodes.get(&e).map(|n| n.kind).ok_or(libc::ENOENT)?;
            match (src_kind == Kind::Dir, ek == Kind::Dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) => {
                    self.ensure_loaded(&mut ns, e)?;
                    if ns.nodes.get(&e).is_some_and(|n| !n.children.is_empty()) {
                        return Err(libc::ENOTEMPTY);
                    }
                }
                _ => {}
            }
        }
        let sp = Self::child_path(&ns, parent, name)?;
        let dp = Self::child_path(&ns, newparent, newname)?;
        let existing_gone = existing.is_some_and(|e| {
            ns.nodes
                .get(&e)
                .is_some_and(|n| n.links.len() <= 1 && n.open == 0)
        });
        let (name_owned, newname_owned) = (name.to_vec(), newname.to_vec());
        self.tx_later(move |tx| {
            db::del_dentry(tx, parent, &name_owned)?;
            db::add_dentry(tx, newparent, &newname_owned, src)?;
            db::push_op(tx, OpKind::Rename, src, &sp, &dp)?;
            if let (Some(e), true) = (existing, existing_gone) {
                db::del_inode(tx, e)?;
            }
            Ok(())
        })
        .map_err(eio)?;
        if let Some(e) = existing {
            let gone = self.unlink_node(&mut ns, newparent, newname, e)?;
            if gone {
                self.destroy(&mut ns, e);
            }
        }
        let t = now_ns();
        ns.remove_child(parent, name);
        ns.insert_child(newparent, newname.to_vec(), src);
        for d in [parent, newparent] {
            if let Some(p) = ns.nodes.get_mut(&d) {
                p.mtime = t;
                p.ctime = t;
            }
        }
        if let Some(n) = ns.nodes.get_mut(&src) {
            if let Some(l) = n.links.iter_mut().find(|l| l.0 == parent && l.1 == name) {
                *l = (newparent, newname.to_vec());
            }
            n.ctime = t;
        }
        self.wake_drainer();
        Ok(())
    }

    /// What the kernel leaves to the file system under `FUSE_HANDLE_KILLPRIV_V2`, as a write,
    /// truncate or chown of a regular file does: removes `security.capability`, and with
    /// `setid` clears set-user-ID, and set-group-ID where the group may execute.
    pub fn kill_priv(&self, ino: u64, setid: bool) -> R<()> {
        let (mode, kind, caps) = {
            let ns = self.ns.lock();
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            (
                n.mode,
                n.kind,
                n.xattrs.contains_key(&b"security.capability"[..]),
            )
        };
        if kind != Kind::File {
            return Ok(());
        }
        if caps {
            match self.setxattr(ino, b"security.capability", None, 0) {
                Ok(()) | Err(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
        let mut kill = 0;
        if setid {
            kill = mode & libc::S_ISUID;
            if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
                kill |= libc::S_ISGID;
            }
        }
        if kill == 0 {
            return Ok(());
        }
        self.setattr(ino, Some(mode & !kill), None, None, None, None, None, false)
            .map(|_| ())
    }

    /// Changes what is given of mode, owner, size (a truncate) and times (`Some(None)`: now).
    /// A change of mode, owner or times is journaled as a setattr row; a truncate queues a
    /// data row once no handle is open. Returns the new attributes. `from_kernel`: the kernel
    /// writing back the times it keeps itself (writeback-cache mode), which never set the
    /// mtime below the file's last direct write ([`super::node::Node::direct_mtime`]). The
    /// kernel also writes its times back with no handle once the file is closed (at a
    /// rename, a link or an unlink, which change the ctime): an mtime alone, no atime, from
    /// between [`KERNEL_COPY_NS`] before the open of the direct handle that last wrote and
    /// that handle's first write is taken for that stale copy too, until the kernel forgets
    /// the inode (`forget_kernel_copy`). A program setting an explicit mtime inside that
    /// window while the kernel still holds the inode would see it kept at the last write.
    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Option<SystemTime>>,
        mtime: Option<Option<SystemTime>>,
        from_kernel: bool,
    ) -> R<Attr> {
        if let Some(s) = size {
            self.truncate(ino, s)?;
        }
        let mut ns = self.ns.lock();
        let t = now_ns();
        let meta_change = mode.is_some() || uid.is_some() || gid.is_some();
        let time_change = atime.is_some() || mtime.is_some();
        {
            let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
            if let Some(m) = mode {
                n.mode = m & 0o7777;
            }
            if let Some(u) = uid {
                n.uid = u;
            }
            if let Some(g) = gid {
                n.gid = g;
            }
            if let Some(a) = atime {
                n.atime = a.map_or(t, ns_of);
            }
            if let Some(m) = mtime {
                n.mtime = m.map_or(t, ns_of);
                let kernel_copy = !meta_change
                    && size.is_none()
                    && atime.is_none()
                    && m.map(ns_of).is_some_and(|m| {
                        n.direct_opened > 0
                            && m >= n.direct_opened - KERNEL_COPY_NS
                            && m < n.direct_first
                    });
                if from_kernel || kernel_copy {
                    n.mtime = n.mtime.max(n.direct_mtime);
                } else if m.is_some() && n.open_w > 0 {
                    // A program set the time while it holds the file open for writing
                    // (`futimens` before its writes, as NFS servers and `cp -p` do): the
                    // kernel keeps this answer's mtime, and a direct write after it moves
                    // the daemon's past it unseen. The last close drops the kernel's entries.
                    n.kernel_stale = true;
                }
            }
            if size.is_some() && mtime.is_none() {
                n.mtime = t;
            }
            n.ctime = t;
        }
        // A file removed while still open (its last name gone) is no longer in the namespace:
        // its attributes change in memory only, nothing of it drains.
        let linked = ns.nodes.get(&ino).is_some_and(|n| !n.links.is_empty()) || ino == ROOT;
        if !linked {
            let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
            return Ok(self.attr_of(ino, n));
        }
        if meta_change || time_change {
            let path = Self::path_of(&ns, ino).ok_or(libc::ENOENT)?;
            let row = {
                let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
                let f = n.data.as_ref().map(|d| d.lock());
                row_of(ino, n, f.as_deref())
            };
            self.tx_attrs(ino, &path, &row).map_err(eio)?;
            self.wake_drainer();
        } else {
            self.persist_node(&ns, ino).map_err(eio)?;
        }
        if size.is_some() {
            let open = ns.nodes.get(&ino).map_or(0, |n| n.open);
            if open == 0 {
                self.queue_data(&ns, ino).map_err(eio)?;
            }
        }
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(self.attr_of(ino, n))
    }

    /// The kernel evicted inode `ino` (FORGET): it holds no copy of its times any more.
    pub fn forget_kernel_copy(&self, ino: u64) {
        if let Some(n) = self.ns.lock().nodes.get_mut(&ino) {
            n.direct_opened = 0;
            n.direct_first = 0;
            n.kernel_stale = false;
        }
    }

    /// Notes an open handle on a regular file (counted in [`Node::open`], and in
    /// [`Node::open_w`] when it may write).
    pub fn open(&self, ino: u64, writes: bool) -> R<()> {
        let mut ns = self.ns.lock();
        let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        if n.kind == Kind::File {
            n.open += 1;
            n.open_w += writes as u32;
        }
        Ok(())
    }

    /// Last close of a handle: the inode row is written and the file queued for draining if
    /// it changed, in one journal operation, queued under the namespace lock
    /// ([`Core::tx_later`]): every later namespace operation journals after it, and neither
    /// this release nor the lookups and getattrs that a program's next operation sends
    /// meanwhile (the release arrives after its `close` returned) wait for SQLite.
    ///
    /// `writes`: the handle may write.
    /// `direct`: the open time of a direct handle (see `crate::refresh`). If that handle
    /// wrote later than [`STALE_NS`] after it, the kernel's cached mtime is stale
    /// ([`super::node::Node::kernel_stale`]). Returns whether the file's entries are to be
    /// dropped from the kernel's cache now (after the reply): its copy is stale and no handle
    /// is open any more.
    pub fn release(&self, ino: u64, direct: Option<i64>, writes: bool) -> R<bool> {
        let mut ns = self.ns.lock();
        let (gone, dirty, drop_entries) = {
            let n = ns.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
            n.open = n.open.saturating_sub(1);
            if writes {
                n.open_w = n.open_w.saturating_sub(1);
            }
            if direct.is_some_and(|opened| n.mtime - opened > STALE_NS) {
                n.kernel_stale = true;
            }
            let drop_entries = n.kernel_stale && n.open == 0;
            if drop_entries {
                n.kernel_stale = false;
            }
            let dirty = n.data.as_ref().is_some_and(|d| d.lock().dirty);
            (n.links.is_empty() && n.open == 0, dirty, drop_entries)
        };
        if gone {
            self.destroy(&mut ns, ino);
            return Ok(false);
        }
        let n = ns.nodes.get(&ino).ok_or(libc::ENOENT)?;
        let data = n.data.clone();
        let mut f = data.as_ref().map(|d| d.lock());
        let row = row_of(ino, n, f.as_deref());
        let paths = if dirty && f.as_ref().is_some_and(|f| !f.data_pending) {
            Self::link_paths(&ns, n)
        } else {
            Vec::new()
        };
        if !writes && paths.is_empty() {
            // A handle that could not write changed nothing the row holds (reads keep clean
            // pages in memory only, and every other change wrote its own row): no journal
            // work, which on a read-mostly job was a savepoint per close under the database
            // lock, serializing every daemon thread.
            return Ok(drop_entries);
        }
        let has_paths = !paths.is_empty();
        self.tx_later(move |tx| {
            db::put_inode(tx, &row)?;
            if let Some(first) = paths.first() {
                db::push_op(tx, OpKind::Data, ino, first, &paths[1..].join(&0u8))?;
            }
            Ok(())
        })
        .map_err(eio)?;
        drop(ns);
        if has_paths {
            if let Some(f) = f.as_mut() {
                f.data_pending = true;
            }
            drop(f);
            self.wake_drainer();
        }
        Ok(drop_entries)
    }
}

/// POSIX ACL tags (`linux/posix_acl.h`).
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// Whether `acl` is an ACL in xattr form: version 2, then whole 8-byte entries.
fn acl_valid(acl: &[u8]) -> bool {
    acl.len() >= 4 && (acl.len() - 4).is_multiple_of(8) && acl[..4] == 2u32.to_le_bytes()
}

/// The permission bits an access ACL (xattr form) stands for: owner from its user entry,
/// group from its mask (or its group entry without one), other from its other entry.
pub fn acl_mode(acl: &[u8]) -> Option<u32> {
    if !acl_valid(acl) {
        return None;
    }
    let (mut u, mut g, mut m, mut o) = (None, None, None, None);
    for e in acl[4..].chunks(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]) as u32 & 0o7;
        match tag {
            ACL_USER_OBJ => u = Some(perm),
            ACL_GROUP_OBJ => g = Some(perm),
            ACL_MASK => m = Some(perm),
            ACL_OTHER => o = Some(perm),
            _ => {}
        }
    }
    Some((u? << 6) | (m.or(g)? << 3) | o?)
}

/// The kernel's `posix_acl_create_masq` over the xattr form of a default ACL (version 2, then
/// entries of tag u16, perm u16, id u32): masks the ACL with `mode` and `mode` with the ACL.
/// Returns the new node's access ACL, or None when the ACL says no more than the mode (or
/// does not parse).
pub fn acl_create_masq(acl: &[u8], mode: &mut u32) -> Option<Vec<u8>> {
    if !acl_valid(acl) {
        return None;
    }
    let mut out = acl.to_vec();
    let n = (acl.len() - 4) / 8;
    let perm_at = |i: usize| 4 + i * 8 + 2;
    let get = |b: &[u8], i: usize| u16::from_le_bytes([b[perm_at(i)], b[perm_at(i) + 1]]) as u32;
    let mut not_equiv = false;
    let (mut group_obj, mut mask_obj) = (None, None);
    for i in 0..n {
        let tag = u16::from_le_bytes([out[4 + i * 8], out[4 + i * 8 + 1]]);
        let mut perm = get(&out, i);
        match tag {
            ACL_USER_OBJ => {
                perm &= (*mode >> 6) | !0o7;
                *mode &= (perm << 6) | !0o700;
            }
            ACL_USER | ACL_GROUP => not_equiv = true,
            ACL_GROUP_OBJ => group_obj = Some(i),
            ACL_OTHER => {
                perm &= *mode | !0o7;
                *mode &= perm | !0o7;
            }
            ACL_MASK => {
                mask_obj = Some(i);
                not_equiv = true;
            }
            _ => return None,
        }
        let p = (perm & 0o7) as u16;
        out[perm_at(i)..perm_at(i) + 2].copy_from_slice(&p.to_le_bytes());
    }
    let g = mask_obj.or(group_obj)?;
    let mut perm = get(&out, g);
    perm &= (*mode >> 3) | !0o7;
    *mode &= (perm << 3) | !0o70;
    let p = (perm & 0o7) as u16;
    out[perm_at(g)..perm_at(g) + 2].copy_from_slice(&p.to_le_bytes());
    not_equiv.then_some(out)
}

#[cfg(test)]
mod acl_tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (t, p, id) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn default_acl_masks_and_is_masked_like_the_kernel() {
        // default: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::r-x; a file made with 0666.
        let def = acl(&[
            (ACL_USER_OBJ, 7, u32::MAX),
            (ACL_USER, 7, 1000),
            (ACL_GROUP_OBJ, 5, u32::MAX),
            (ACL_MASK, 7, u32::MAX),
            (ACL_OTHER, 5, u32::MAX),
        ]);
        let mut mode = 0o666;
        let got = acl_create_masq(&def, &mut mode).expect("an access ACL");
        assert_eq!(mode, 0o664);
        let want = acl(&[
            (ACL_USER_OBJ, 6, u32::MAX),
            (ACL_USER, 7, 1000),
            (ACL_GROUP_OBJ, 5, u32::MAX),
            (ACL_MASK, 6, u32::MAX),
            (ACL_OTHER, 4, u32::MAX),
        ]);
        assert_eq!(got, want);
        // A minimal ACL says no more than the mode.
        let min = acl(&[
            (ACL_USER_OBJ, 7, u32::MAX),
            (ACL_GROUP_OBJ, 5, u32::MAX),
            (ACL_OTHER, 5, u32::MAX),
        ]);
        let mut mode = 0o777;
        assert!(acl_create_masq(&min, &mut mode).is_none());
        assert_eq!(mode, 0o755);
        assert!(acl_create_masq(b"junk", &mut mode).is_none());
        assert_eq!(acl_mode(&want), Some(0o664));
        assert_eq!(acl_mode(&min), Some(0o755));
    }
}
