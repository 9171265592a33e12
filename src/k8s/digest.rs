//! Hashes of values by their text (their JSON or `Debug` form) without building that text.
//! The watch-event filters fingerprint an object per event, thousands of times a second while
//! a fan-out's writes come back; a `String` of each object (and a clone to format) was most of
//! what that cost. The hashes live in memory only, within one process: equal values write the
//! same pieces of text in the same order, so they hash equal, and nothing compares a hash with
//! another process's or another Rust's. (A dozen lines: `serde_json` and `std::fmt` already
//! write into any writer; no crate is needed to make a hasher one.)

use std::collections::hash_map::DefaultHasher;
use std::fmt::Debug;
use std::hash::Hasher;

/// Feeds what is written to it into a [`Hasher`], piece by piece.
struct HashWriter<H>(H);

impl<H: Hasher> std::fmt::Write for HashWriter<H> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl<H: Hasher> std::io::Write for HashWriter<H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A hash of `v`'s JSON form (`serde_json::to_vec`'s bytes, never built).
pub fn json(v: &impl serde::Serialize) -> u64 {
    let mut w = HashWriter(DefaultHasher::new());
    // Writing into a hasher cannot fail; a value that cannot serialize hashes what it wrote.
    let _ = serde_json::to_writer(&mut w, v);
    w.0.finish()
}

/// A hash of `v`'s `Debug` form (`format!("{v:?}")`'s bytes, never built).
pub fn debug(v: &impl Debug) -> u64 {
    use std::fmt::Write;
    let mut w = HashWriter(DefaultHasher::new());
    let _ = write!(w, "{v:?}");
    w.0.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn of_bytes(b: &[u8]) -> u64 {
        let mut h = DefaultHasher::new();
        h.write(b);
        h.finish()
    }

    /// With today's std hasher (SipHash, which streams its input), the pieces hash as the whole
    /// text would; what the module relies on is only that equal values hash equal.
    #[test]
    fn equal_values_hash_as_their_text_would() {
        let v: BTreeMap<&str, Vec<i32>> = [("a", vec![1, 2]), ("b", vec![])].into();
        assert_eq!(json(&v), of_bytes(&serde_json::to_vec(&v).unwrap()));
        assert_eq!(debug(&v), of_bytes(format!("{v:?}").as_bytes()));
    }

    #[test]
    fn different_values_hash_differently() {
        assert_ne!(json(&("a", 1)), json(&("a", 2)));
        assert_ne!(debug(&Some("x")), debug(&None::<&str>));
    }
}
