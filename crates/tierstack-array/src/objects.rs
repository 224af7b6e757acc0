//! Named objects of any size on top of the array's keys, for `array put/get`: an object is
//! split into 1 MiB pages under a fresh object id, and a name record points at it. The name
//! record is written last, so a put either replaces the object whole or not at all; pages of
//! an interrupted put are collected by [`ObjectStore::open`].

use std::io::{Read, Write};

use parking_lot::Mutex;

use crate::array::{Array, Key};
use crate::error::{ArrayError, Result};
use crate::layout::MAX_VALUE;

/// Object id of name records (page = hash slot).
pub const NAME_OBJ: u64 = u64::MAX;
/// Object ids of object data live in [DATA_BASE, DATA_LAST].
pub const DATA_BASE: u64 = 0xFE00_0000_0000_0000;
/// Last object id used for object data (inclusive).
pub const DATA_LAST: u64 = 0xFEFF_FFFF_FFFF_FFFF;
const PROBES: u64 = 16;
const MAGIC: &[u8; 4] = b"TSNM";

/// What a name record says about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's name (1 to 4000 bytes of UTF-8).
    pub name: String,
    /// Object id of its pages in the array, in [`DATA_BASE`] ..= [`DATA_LAST`].
    pub id: u64,
    /// Size of the object in bytes.
    pub size: u64,
}

/// A name lookup: the record found (its key and contents) and the first free slot seen.
type Found = (Option<(Key, ObjectInfo)>, Option<Key>);

/// Named objects stored in an [`Array`]; see the module docs.
pub struct ObjectStore {
    array: Array,
    next_id: Mutex<u64>,
}

fn encode_name(info: &ObjectInfo) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + info.name.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(info.name.len() as u32).to_le_bytes());
    v.extend_from_slice(info.name.as_bytes());
    v.extend_from_slice(&info.id.to_le_bytes());
    v.extend_from_slice(&info.size.to_le_bytes());
    v
}

fn decode_name(b: &[u8]) -> Option<ObjectInfo> {
    if b.get(..4)? != MAGIC {
        return None;
    }
    let n = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(b.get(8..8 + n)?).ok()?.to_string();
    let id = u64::from_le_bytes(b.get(8 + n..16 + n)?.try_into().ok()?);
    let size = u64::from_le_bytes(b.get(16 + n..24 + n)?.try_into().ok()?);
    Some(ObjectInfo { name, id, size })
}

fn slot(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

impl ObjectStore {
    /// Wraps an array; removes pages no name points to (left by an interrupted put).
    pub fn open(array: Array) -> Result<ObjectStore> {
        let names = Self::scan(&array)?;
        let live: std::collections::HashSet<u64> = names.iter().map(|o| o.id).collect();
        let mut max = DATA_BASE;
        let mut orphans = 0;
        for k in array.keys_in(DATA_BASE, DATA_LAST) {
            max = max.max(k.0 + 1);
            if !live.contains(&k.0) {
                array.delete(k)?;
                orphans += 1;
            }
        }
        if orphans > 0 {
            array.flush()?;
        }
        Ok(ObjectStore {
            array,
            next_id: Mutex::new(max),
        })
    }

    /// The underlying array.
    pub fn array(&self) -> &Array {
        &self.array
    }

    fn scan(array: &Array) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        for k in array.keys_in(NAME_OBJ, NAME_OBJ) {
            if let Some(v) = array.get(k)? {
                if let Some(info) = decode_name(&v) {
                    out.push(info);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Every object, sorted by name.
    pub fn list(&self) -> Result<Vec<ObjectInfo>> {
        Self::scan(&self.array)
    }

    /// Finds the name record of `name`: (its key, its info) or the first free slot.
    fn find(&self, name: &str) -> Result<Found> {
        let h = slot(name);
        let mut free = None;
        for i in 0..PROBES {
            let k = (NAME_OBJ, h.wrapping_add(i));
            match self.array.get(k)? {
                Some(v) => {
                    if let Some(info) = decode_name(&v) {
                        if info.name == name {
                            return Ok((Some((k, info)), free));
                        }
                    }
                }
                None => {
                    if free.is_none() {
                        free = Some(k);
                    }
                }
            }
        }
        Ok((None, free))
    }

    /// The info of object `name`, or `None` if there is no such object.
    pub fn stat(&self, name: &str) -> Result<Option<ObjectInfo>> {
        Ok(self.find(name)?.0.map(|(_, i)| i))
    }

    /// Stores everything `src` yields as object `name`, replacing any earlier version, and
    /// flushes: when this returns Ok the object is durable.
    pub fn put(&self, name: &str, src: &mut dyn Read) -> Result<ObjectInfo> {
        if name.is_empty() || name.len() > 4000 {
            return Err(ArrayError::Config(
                "object name must be 1 to 4000 bytes".into(),
            ));
        }
        let id = {
            let mut n = self.next_id.lock();
            let id = *n;
            *n += 1;
            id
        };
        // The pages must be durable before the name record can point at them.
        let written = self
            .write_pages(id, src)
            .and_then(|n| self.array.flush().map(|_| n));
        let size = match written {
            Ok(s) => s,
            Err(e) => {
                self.drop_pages(id);
                return Err(e);
            }
        };
        let (existing, free) = self.find(name)?;
        let info = ObjectInfo {
            name: name.to_string(),
            id,
            size,
        };
        let key = match (&existing, free) {
            (Some((k, _)), _) => *k,
            (None, Some(k)) => k,
            (None, None) => {
                self.drop_pages(id);
                return Err(ArrayError::NoSpace(format!(
                    "no free name slot for '{name}'"
                )));
            }
        };
        let res = self
            .array
            .put(key, &encode_name(&info))
            .and_then(|_| self.array.flush());
        if let Err(e) = res {
            self.drop_pages(id);
            return Err(e);
        }
        if let Some((_, old)) = existing {
            self.delete_pages(old.id)?;
            self.array.flush()?;
        }
        Ok(info)
    }

    fn write_pages(&self, id: u64, src: &mut dyn Read) -> Result<u64> {
        let mut buf = vec![0u8; MAX_VALUE];
        let mut page = 0u64;
        let mut total = 0u64;
        loop {
            let mut filled = 0;
            while filled < buf.len() {
                let n = match src.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(ArrayError::io("object input", e)),
                };
                filled += n;
            }
            if filled == 0 {
                break;
            }
            self.array.put((id, page), &buf[..filled])?;
            page += 1;
            total += filled as u64;
            if filled < buf.len() {
                break;
            }
        }
        Ok(total)
    }

    fn delete_pages(&self, id: u64) -> Result<()> {
        for k in self.array.keys_in(id, id) {
            self.array.delete(k)?;
        }
        Ok(())
    }

    fn drop_pages(&self, id: u64) {
        let _ = self.delete_pages(id);
    }

    /// Writes object `name` to `dst`. Returns its info, or None if there is no such object.
    pub fn get(&self, name: &str, dst: &mut dyn Write) -> Result<Option<ObjectInfo>> {
        let Some(info) = self.stat(name)? else {
            return Ok(None);
        };
        let pages = info.size.div_ceil(MAX_VALUE as u64);
        let mut total = 0u64;
        for p in 0..pages {
            let v = self.array.get((info.id, p))?.ok_or_else(|| {
                ArrayError::DataLoss(format!("object '{name}' is missing page {p}"))
            })?;
            dst.write_all(&v)
                .map_err(|e| ArrayError::io("object output", e))?;
            total += v.len() as u64;
        }
        if total != info.size {
            return Err(ArrayError::DataLoss(format!(
                "object '{name}' has {total} bytes, expected {}",
                info.size
            )));
        }
        Ok(Some(info))
    }

    /// Deletes object `name`; durable on return. Returns whether it existed.
    pub fn delete(&self, name: &str) -> Result<bool> {
        let Some((k, info)) = self.find(name)?.0 else {
            return Ok(false);
        };
        self.array.delete(k)?;
        self.delete_pages(info.id)?;
        self.array.flush()?;
        Ok(true)
    }
}
