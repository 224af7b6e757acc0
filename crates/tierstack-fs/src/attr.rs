//! What a node is, as the namespace keeps it and the operations hand it out: its [`Kind`] and
//! its [`Attr`]ibutes. Plain data below both the core and the operation table.

/// The page size of file contents in the store (the store's largest value); also every
/// node's `st_blksize` (large I/O sizes for tools that follow it: `cp`, `dd` without `bs`).
pub const PAGE: u64 = 1 << 20;

/// The type of a node; the discriminant is the `kind` column of the `inodes` table.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// A regular file.
    File = 1,
    /// A directory.
    Dir = 2,
    /// A symbolic link.
    Symlink = 3,
    /// A named pipe.
    Fifo = 4,
    /// A Unix domain socket.
    Socket = 5,
    /// A character device node.
    CharDev = 6,
    /// A block device node.
    BlockDev = 7,
}

impl Kind {
    /// The kind stored as `v` in the `inodes` table (an unknown value reads as a file).
    pub(crate) fn from_u8(v: u8) -> Kind {
        match v {
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => Kind::File,
        }
    }

    /// The kind of a `st_mode`'s type bits (None: not one the mount keeps).
    pub fn of_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }

    /// The type bits of `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }

    /// FIFOs, sockets and device nodes (made with `mknod`; `Node::target` holds the device
    /// number as 8 little-endian bytes).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
        )
    }
}

/// Attributes handed to the FUSE layer.
#[derive(Clone, Debug)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// The node's type.
    pub kind: Kind,
    /// Permission, set-ID and sticky bits (`0o7777`).
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
    /// Link count (a directory: 2 plus its subdirectories).
    pub nlink: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// 512-byte blocks held: pages in the fast tier and the base's blocks in BACKING (a
    /// sparse file shows what it holds, not its size).
    pub blocks: u64,
    /// The node's generation, handed to the kernel with each entry: with the inode number it
    /// makes the file handle an NFS export gives out (see `Core::generation`). 0 for the root
    /// (the kernel's own root inode has generation 0).
    pub generation: u32,
}
