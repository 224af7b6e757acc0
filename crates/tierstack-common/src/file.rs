//! Small file helpers several crates share.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Opens `path` for reading and writing, creating it (empty) when it does not exist and never
/// truncating it: how drives, images and logs that keep their contents are opened.
pub fn open_or_create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn creates_then_keeps_contents() {
        let p = std::env::temp_dir().join(format!("tierstack-common-file-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        open_or_create(&p)
            .and_then(|mut f| f.write_all(b"kept"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut s = String::new();
        open_or_create(&p)
            .and_then(|mut f| f.read_to_string(&mut s))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s, "kept");
        let _ = std::fs::remove_file(&p);
    }
}
