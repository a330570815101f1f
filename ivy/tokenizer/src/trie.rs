//! A static double-array trie over byte strings.
//!
//! Each state is one 16-byte unit holding its transition base, the parent
//! check, the id of the key ending there and that key's score, so a walk that
//! finds a piece also has its score in the same cache line: no hashing and no
//! second lookup on the hot path. A transition on byte `b` from state `s`
//! goes to `t = base(s) + b`, valid when `check(t) == s`.

/// Marks a unit no state owns.
const FREE: u32 = u32::MAX;
/// The root's `check`: differs from every state index.
const ROOT_CHECK: u32 = u32::MAX - 1;
/// Marks a state where no key ends.
pub(crate) const NO_VALUE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
struct Unit {
    base: u32,
    check: u32,
    value: u32,
    score: f32,
}

const EMPTY: Unit = Unit {
    base: 0,
    check: FREE,
    value: NO_VALUE,
    score: 0.0,
};

/// A state of the trie (the root is [`Trie::ROOT`]).
pub(crate) type State = u32;

#[derive(Clone, Debug)]
pub(crate) struct Trie {
    units: Vec<Unit>,
}

impl Trie {
    pub(crate) const ROOT: State = 0;

    /// Builds the trie from `(key, value, score)` entries. When a key appears
    /// more than once, the last entry wins (as a map insert would). Empty
    /// keys are not stored: a walk never reports a match of length zero.
    pub(crate) fn build<'a>(entries: impl IntoIterator<Item = (&'a [u8], u32, f32)>) -> Self {
        let mut keys: Vec<(&[u8], u32, f32, usize)> = entries
            .into_iter()
            .enumerate()
            .filter(|(_, (k, _, _))| !k.is_empty())
            .map(|(i, (k, v, s))| (k, v, s, i))
            .collect();
        // Sort by key, later entries first among equal keys, then keep the
        // first of each run: "last insert wins".
        keys.sort_unstable_by(|a, b| a.0.cmp(b.0).then(b.3.cmp(&a.3)));
        keys.dedup_by(|next, kept| next.0 == kept.0);
        let mut builder = Builder::new(keys.iter().map(|k| k.0.len()).sum::<usize>() + 256);
        builder.units[0].check = ROOT_CHECK;
        builder.unlink(0);
        let keys: Vec<(&[u8], u32, f32)> = keys.into_iter().map(|(k, v, s, _)| (k, v, s)).collect();
        if !keys.is_empty() {
            builder.place(0, &keys, 0);
        }
        builder.finish()
    }

    /// Follows byte `b` from state `s`.
    #[inline(always)]
    pub(crate) fn next(&self, s: State, b: u8) -> Option<State> {
        let t = self.units[s as usize].base.wrapping_add(b as u32);
        match self.units.get(t as usize) {
            Some(u) if u.check == s => Some(t),
            _ => None,
        }
    }

    /// The value of the key ending at `s`, or [`NO_VALUE`].
    #[inline(always)]
    pub(crate) fn value(&self, s: State) -> u32 {
        self.units[s as usize].value
    }

    /// The score stored with the key ending at `s`.
    #[inline(always)]
    pub(crate) fn score(&self, s: State) -> f32 {
        self.units[s as usize].score
    }

    /// Follows all of `key` from `s`.
    pub(crate) fn walk(&self, mut s: State, key: &[u8]) -> Option<State> {
        for &b in key {
            s = self.next(s, b)?;
        }
        Some(s)
    }

    /// The value of exactly `key`, if it is stored.
    pub(crate) fn get(&self, key: &[u8]) -> Option<u32> {
        let s = self.walk(Self::ROOT, key)?;
        let v = self.value(s);
        (v != NO_VALUE).then_some(v)
    }

    /// Bytes of memory the trie occupies.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.units.len() * std::mem::size_of::<Unit>()
    }
}

/// Places states into the array: each state's children go where all their
/// slots are free, found through a list of free units.
struct Builder {
    units: Vec<Unit>,
    /// Doubly linked list of free units (indices), as `(prev, next)`.
    links: Vec<(u32, u32)>,
    /// First free unit; `FREE` when the list is empty (the array then grows).
    head: u32,
    /// How often each free unit was tried as a first child and rejected.
    rejects: Vec<u8>,
}

/// A free unit rejected this often leaves the search list (it stays free):
/// otherwise every search would rescan the same low, unusable units.
const MAX_REJECTS: u8 = 8;

impl Builder {
    fn new(capacity: usize) -> Self {
        let mut b = Self {
            units: Vec::with_capacity(capacity),
            links: Vec::with_capacity(capacity),
            head: FREE,
            rejects: Vec::with_capacity(capacity),
        };
        b.grow(capacity.max(512));
        b
    }

    /// Extends the array to `len` units, all free, appended to the free list.
    fn grow(&mut self, len: usize) {
        let old = self.units.len();
        if len <= old {
            return;
        }
        self.units.resize(len, EMPTY);
        self.links.resize(len, (FREE, FREE));
        self.rejects.resize(len, 0);
        // Find the tail of the current list to append the new units in order.
        let mut tail = FREE;
        if self.head != FREE {
            tail = self.links[self.head as usize].0;
        }
        for i in old..len {
            let i = i as u32;
            if tail == FREE {
                self.head = i;
            } else {
                self.links[tail as usize].1 = i;
            }
            self.links[i as usize].0 = tail;
            tail = i;
        }
        // Circular: the head's `prev` is the tail, the tail's `next` is FREE.
        self.links[self.head as usize].0 = tail;
        self.links[tail as usize].1 = FREE;
    }

    /// Removes unit `i` from the free list (it was just used, or is skipped).
    fn unlink(&mut self, i: usize) {
        let in_list = i as u32 == self.head || self.links[i].0 != FREE;
        if !in_list {
            return;
        }
        let (prev, next) = self.links[i];
        let tail = self.links[self.head as usize].0;
        if i as u32 == self.head {
            self.head = next;
            if next != FREE {
                self.links[next as usize].0 = tail;
            }
        } else {
            self.links[prev as usize].1 = next;
            if next != FREE {
                self.links[next as usize].0 = prev;
            } else {
                // `i` was the tail: the new tail is `prev`.
                self.links[self.head as usize].0 = prev;
            }
        }
        self.links[i] = (FREE, FREE);
    }

    fn is_free(&self, i: usize) -> bool {
        i >= self.units.len() || self.units[i].check == FREE
    }

    /// Finds a base where every `labels` slot is free.
    fn find_base(&mut self, labels: &[u8]) -> u32 {
        let first = labels[0] as u32;
        let mut f = self.head;
        loop {
            let next = if f == FREE { FREE } else { self.links[f as usize].1 };
            if f == FREE {
                // No room in the array: put the children past its end.
                let base = (self.units.len() as u32).max(first) - first;
                self.grow(base as usize + 256 + 1);
                return base;
            }
            if f >= first {
                let base = f - first;
                if labels[1..].iter().all(|&l| self.is_free((base + l as u32) as usize)) {
                    self.grow(base as usize + 256 + 1);
                    return base;
                }
            }
            self.rejects[f as usize] += 1;
            if self.rejects[f as usize] >= MAX_REJECTS {
                self.unlink(f as usize);
            }
            f = next;
        }
    }

    /// Places the children of `state`, which holds the sorted, distinct
    /// `keys` sharing their first `depth` bytes; recurses depth-first.
    fn place(&mut self, state: u32, keys: &[(&[u8], u32, f32)], depth: usize) {
        let mut rest = keys;
        if let Some(&(k, v, s)) = rest.first() {
            if k.len() == depth {
                self.units[state as usize].value = v;
                self.units[state as usize].score = s;
                rest = &rest[1..];
            }
        }
        if rest.is_empty() {
            return;
        }
        // Group the remaining keys by their byte at `depth`.
        let mut labels = [0u8; 256];
        let mut groups = [(0usize, 0usize); 256];
        let mut n = 0;
        let mut i = 0;
        while i < rest.len() {
            let label = rest[i].0[depth];
            let start = i;
            while i < rest.len() && rest[i].0[depth] == label {
                i += 1;
            }
            labels[n] = label;
            groups[n] = (start, i);
            n += 1;
        }
        let base = self.find_base(&labels[..n]);
        self.units[state as usize].base = base;
        for &label in &labels[..n] {
            let t = (base + label as u32) as usize;
            self.units[t].check = state;
            self.unlink(t);
        }
        for (&label, &(start, end)) in labels[..n].iter().zip(&groups[..n]) {
            self.place(base + label as u32, &rest[start..end], depth + 1);
        }
    }

    fn finish(mut self) -> Trie {
        let last_used = self
            .units
            .iter()
            .rposition(|u| u.check != FREE)
            .unwrap_or(0);
        // Keep 256 units past the last state so `base + b` of any state that
        // has children stays inside the array.
        let max_base = self.units.iter().map(|u| u.base as usize).max().unwrap_or(0);
        let len = (last_used + 1).max(max_base + 256).max(256);
        self.units.truncate(len);
        self.units.resize(len, EMPTY);
        self.units.shrink_to_fit();
        Trie { units: self.units }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[&str]) -> Trie {
        Trie::build(keys.iter().enumerate().map(|(i, k)| (k.as_bytes(), i as u32, i as f32)))
    }

    #[test]
    fn finds_exactly_the_stored_keys() {
        let keys = ["a", "ab", "abc", "b", "▁the", "▁th", "x\u{0}y", "ü"];
        let t = trie(&keys);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k.as_bytes()), Some(i as u32), "{k}");
            let s = t.walk(Trie::ROOT, k.as_bytes()).unwrap();
            assert_eq!(t.score(s), i as f32);
        }
        for k in ["", "abcd", "c", "▁t", "u", "x"] {
            assert_eq!(t.get(k.as_bytes()), None, "{k}");
        }
    }

    #[test]
    fn last_duplicate_wins_and_empty_keys_are_skipped() {
        let t = Trie::build([
            (&b"ab"[..], 1, 1.0),
            (&b""[..], 2, 2.0),
            (&b"ab"[..], 3, 3.0),
        ]);
        assert_eq!(t.get(b"ab"), Some(3));
        assert_eq!(t.get(b""), None);
    }

    #[test]
    fn many_keys_with_every_byte() {
        let mut keys = Vec::new();
        for a in 0..=255u8 {
            for b in (0..=255u8).step_by(7) {
                keys.push(vec![a, b]);
            }
            keys.push(vec![a]);
        }
        let t = Trie::build(keys.iter().enumerate().map(|(i, k)| (k.as_slice(), i as u32, 0.0)));
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), Some(i as u32));
        }
        assert_eq!(t.get(&[0, 1]), None);
    }
}
