//! Which nodes may have which paths in BACKING: a node's backing path (`Node::bpath`, which
//! its file's `FileData::bpath` equals whenever the namespace lock is free) and its file's
//! staging file (`FileData::staged`). The drain's rename and rmdir rows ask for the nodes
//! with a path at or under one path ([`PathIndex::under`]); without the index each such row
//! walked every node and locked every file (5,000 renames beside 65,000 files took 66.7 s
//! to drain, 13 ms a row, nearly all of it in those walks).
//!
//! The index may hold more than is true (a path a node has since left), never less: every
//! place that gives a node a path notes it here, under the namespace lock, no later than the
//! change; the callers check each node the index names against the node itself, and
//! [`PathIndex::retain`] drops what is no longer true. Pure: a map and its operations,
//! property-tested against a list.

use std::collections::BTreeMap;

/// Path → the inode numbers noted at it (a number once per path).
#[derive(Debug, Default)]
pub struct PathIndex {
    map: BTreeMap<Vec<u8>, Vec<u64>>,
    entries: usize,
}

impl PathIndex {
    /// Notes that node `ino` may be at `path`.
    pub fn note(&mut self, path: &[u8], ino: u64) {
        let v = self.map.entry(path.to_vec()).or_default();
        if !v.contains(&ino) {
            v.push(ino);
            self.entries += 1;
        }
    }

    /// Forgets that node `ino` may be at `path`.
    pub fn forget(&mut self, path: &[u8], ino: u64) {
        if let Some(v) = self.map.get_mut(path) {
            if let Some(i) = v.iter().position(|x| *x == ino) {
                v.swap_remove(i);
                self.entries -= 1;
            }
            if v.is_empty() {
                self.map.remove(path);
            }
        }
    }

    /// The (path, node) pairs noted at `root` or under it (`root` itself, or a path that
    /// continues it with `/`; the empty root is above every path), in path order.
    pub fn under(&self, root: &[u8]) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut push = |k: &Vec<u8>, v: &Vec<u64>| {
            for i in v {
                out.push((k.clone(), *i));
            }
        };
        if root.is_empty() {
            for (k, v) in &self.map {
                push(k, v);
            }
            return out;
        }
        if let Some(v) = self.map.get(root) {
            push(&root.to_vec(), v);
        }
        // Paths under `root` sort between `root/` and `root0` ('0' follows '/').
        let mut lo = root.to_vec();
        lo.push(b'/');
        let mut hi = root.to_vec();
        hi.push(b'/' + 1);
        for (k, v) in self.map.range(lo..hi) {
            push(k, v);
        }
        out
    }

    /// The node numbers noted at `root` or under it, each once, in increasing order.
    pub fn nodes_under(&self, root: &[u8]) -> Vec<u64> {
        let mut v: Vec<u64> = self.under(root).into_iter().map(|(_, i)| i).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Keeps only the pairs `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], u64) -> bool) {
        let mut entries = 0;
        self.map.retain(|k, v| {
            v.retain(|i| keep(k, *i));
            entries += v.len();
            !v.is_empty()
        });
        self.entries = entries;
    }

    /// How many (path, node) pairs are noted.
    pub fn len(&self) -> usize {
        self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether `path` is at or under `root` as [`PathIndex::under`] counts it.
    fn is_under(path: &[u8], root: &[u8]) -> bool {
        root.is_empty() || crate::core::under(path, root)
    }

    fn path(i: u8) -> Vec<u8> {
        // A small alphabet of nested paths, with names that sort around '/'.
        const P: [&str; 10] = [
            "a", "a/b", "a/b/c", "a.b", "a0", "a-x", "ab", "b", "b/a", "a/b0",
        ];
        P[i as usize % P.len()].as_bytes().to_vec()
    }

    #[test]
    fn under_finds_the_root_and_what_continues_it_with_a_slash() {
        let mut ix = PathIndex::default();
        for (i, p) in ["a", "a/b", "a/b/c", "a.b", "a0", "ab", "a-x", "b"]
            .iter()
            .enumerate()
        {
            ix.note(p.as_bytes(), i as u64);
        }
        assert_eq!(ix.nodes_under(b"a"), vec![0, 1, 2]);
        assert_eq!(ix.nodes_under(b"a/b"), vec![1, 2]);
        assert_eq!(ix.nodes_under(b"x"), Vec::<u64>::new());
        assert_eq!(ix.nodes_under(b"").len(), 8);
        ix.forget(b"a/b", 1);
        assert_eq!(ix.nodes_under(b"a"), vec![0, 2]);
        assert_eq!(ix.len(), 7);
    }

    proptest! {
        #[test]
        fn the_index_answers_as_a_list_of_pairs(
            ops in proptest::collection::vec((0u8..3, 0u8..10, 0u64..6), 0..80),
            root in 0u8..11,
        ) {
            let mut ix = PathIndex::default();
            let mut model: Vec<(Vec<u8>, u64)> = Vec::new();
            for (op, p, ino) in ops {
                let p = path(p);
                match op {
                    0 | 1 => {
                        ix.note(&p, ino);
                        if !model.contains(&(p.clone(), ino)) {
                            model.push((p, ino));
                        }
                    }
                    _ => {
                        ix.forget(&p, ino);
                        model.retain(|e| *e != (p.clone(), ino));
                    }
                }
            }
            prop_assert_eq!(ix.len(), model.len());
            let root = if root == 10 { Vec::new() } else { path(root) };
            let mut want: Vec<u64> = model
                .iter()
                .filter(|(p, _)| is_under(p, &root))
                .map(|(_, i)| *i)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(ix.nodes_under(&root), want);
            ix.retain(|_, i| i % 2 == 0);
            prop_assert_eq!(ix.len(), model.iter().filter(|(_, i)| i % 2 == 0).count());
        }
    }
}
