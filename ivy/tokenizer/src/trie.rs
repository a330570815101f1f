//! A static double-array trie over byte strings.
//!
//! Each state is one 8-byte unit: its transition base, and its label with
//! the value (id) of the key ending there. A walk that finds a piece has its
//! id in the same cache line (no hashing, no second lookup), eight states
//! share a line, and states are laid out so that a walk stays in few lines.
//!
//! A transition on byte `b` from state `s` goes to `t = base(s) + b`, valid
//! when unit `t` is occupied with label `b`. Checking the label rather than
//! the parent is sound because no two states share a base; states without
//! children point at a block of unoccupied units.

/// The value stored where no key ends.
pub(crate) const NO_VALUE: u32 = (1 << 23) - 1;
/// The largest value a key may carry.
pub(crate) const MAX_VALUE: u32 = NO_VALUE - 1;

const OCCUPIED: u32 = 1 << 8;
const LABEL_MASK: u32 = 0x1FF;
const VALUE_SHIFT: u32 = 9;

#[derive(Clone, Copy, Debug)]
#[repr(C, align(8))]
struct Unit {
    base: u32,
    /// Bits 0–7: the label; bit 8: occupied; bits 9–31: the value.
    meta: u32,
}

const EMPTY: Unit = Unit {
    base: 0,
    meta: NO_VALUE << VALUE_SHIFT,
};

/// A state of the trie (the root is [`Trie::ROOT`]).
pub(crate) type State = u32;

#[derive(Clone, Debug)]
pub(crate) struct Trie {
    units: Vec<Unit>,
    /// The longest key, in bytes.
    max_key_len: usize,
}

impl Trie {
    pub(crate) const ROOT: State = 0;

    /// Builds the trie from `(key, value)` entries. When a key appears more
    /// than once, the last entry wins (as a map insert would). Empty keys
    /// are not stored: a walk never reports a match of length zero. Values
    /// must be at most [`MAX_VALUE`].
    pub(crate) fn build<'a>(entries: impl IntoIterator<Item = (&'a [u8], u32)>) -> Self {
        let mut keys: Vec<(&[u8], u32, usize)> = entries
            .into_iter()
            .enumerate()
            .filter(|(_, (k, _))| !k.is_empty())
            .map(|(i, (k, v))| (k, v.min(MAX_VALUE), i))
            .collect();
        // Sort by key, later entries first among equal keys, then keep the
        // first of each run: "last insert wins".
        keys.sort_unstable_by(|a, b| a.0.cmp(b.0).then(b.2.cmp(&a.2)));
        keys.dedup_by(|next, kept| next.0 == kept.0);
        let keys: Vec<(&[u8], u32)> = keys.into_iter().map(|(k, v, _)| (k, v)).collect();
        let mut builder = Builder::new(keys.iter().map(|k| k.0.len()).sum::<usize>() + 512);
        builder.occupy(0, 0);
        builder.place_all(&keys);
        Trie {
            units: builder.finish(),
            max_key_len: keys.iter().map(|k| k.0.len()).max().unwrap_or(0),
        }
    }

    /// Follows byte `b` from state `s`.
    #[inline(always)]
    pub(crate) fn next(&self, s: State, b: u8) -> Option<State> {
        // In bounds for every state: bases leave 256 units of room.
        let t = self.units[s as usize].base.wrapping_add(b as u32);
        match self.units.get(t as usize) {
            Some(u) if u.meta & LABEL_MASK == OCCUPIED | b as u32 => Some(t),
            _ => None,
        }
    }

    /// Whether a key ends at `s`.
    #[inline(always)]
    pub(crate) fn is_key(&self, s: State) -> bool {
        self.value(s) != NO_VALUE
    }

    /// The value of the key ending at `s`, or [`NO_VALUE`].
    #[inline(always)]
    pub(crate) fn value(&self, s: State) -> u32 {
        self.units[s as usize].meta >> VALUE_SHIFT
    }

    /// The longest key, in bytes.
    pub(crate) fn max_key_len(&self) -> usize {
        self.max_key_len
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
        self.is_key(s).then(|| self.value(s))
    }

    /// Bytes of memory the trie occupies.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.units.len() * std::mem::size_of::<Unit>()
    }
}

/// Marks "no unit" in the free list.
const NIL: u32 = u32::MAX;
/// How far past a state its children are looked for first.
const NEAR: u32 = 48;
/// A free unit rejected this often leaves the search list (it stays free):
/// otherwise every search would rescan the same low, unusable units.
const MAX_REJECTS: u8 = 8;

/// Places states into the array: each state's children go where all their
/// slots are free and the base is unused, preferably right after the state.
struct Builder {
    units: Vec<Unit>,
    /// Bases already given to a state.
    used_base: Vec<bool>,
    /// Doubly linked list of free units (indices), as `(prev, next)`; the
    /// head's `prev` is the tail.
    links: Vec<(u32, u32)>,
    head: u32,
    /// How often each free unit was tried as a first child and rejected.
    rejects: Vec<u8>,
}

impl Builder {
    fn new(capacity: usize) -> Self {
        let mut b = Self {
            units: Vec::with_capacity(capacity),
            used_base: Vec::with_capacity(capacity),
            links: Vec::with_capacity(capacity),
            head: NIL,
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
        self.used_base.resize(len, false);
        self.links.resize(len, (NIL, NIL));
        self.rejects.resize(len, 0);
        let mut tail = if self.head == NIL {
            NIL
        } else {
            self.links[self.head as usize].0
        };
        for i in old as u32..len as u32 {
            if tail == NIL {
                self.head = i;
            } else {
                self.links[tail as usize].1 = i;
            }
            self.links[i as usize].0 = tail;
            tail = i;
        }
        self.links[self.head as usize].0 = tail;
        self.links[tail as usize].1 = NIL;
    }

    fn is_free(&self, i: usize) -> bool {
        i >= self.units.len() || self.units[i].meta & OCCUPIED == 0
    }

    /// Removes unit `i` from the free list, if it is there.
    fn unlink(&mut self, i: usize) {
        let in_list = i as u32 == self.head || self.links[i].0 != NIL;
        if !in_list {
            return;
        }
        let (prev, next) = self.links[i];
        let tail = self.links[self.head as usize].0;
        if i as u32 == self.head {
            self.head = next;
            if next != NIL {
                self.links[next as usize].0 = tail;
            }
        } else {
            self.links[prev as usize].1 = next;
            if next != NIL {
                self.links[next as usize].0 = prev;
            } else {
                self.links[self.head as usize].0 = prev;
            }
        }
        self.links[i] = (NIL, NIL);
    }

    fn occupy(&mut self, i: usize, label: u8) {
        self.units[i].meta = (self.units[i].meta & !LABEL_MASK) | OCCUPIED | label as u32;
        self.unlink(i);
    }

    /// Whether `base` can hold children with `labels`.
    fn fits(&self, base: u32, labels: &[u8]) -> bool {
        base >= 1
            && !self.used_base.get(base as usize).copied().unwrap_or(false)
            && labels
                .iter()
                .all(|&l| self.is_free((base + l as u32) as usize))
    }

    /// A base right after `parent`, so a walk's next state shares its line.
    fn find_base_near(&self, parent: u32, labels: &[u8]) -> Option<u32> {
        let first = labels[0] as u32;
        (parent + 1..parent + 1 + NEAR)
            .filter(|&t| t >= first)
            .map(|t| t - first)
            .find(|&base| self.fits(base, labels))
    }

    /// Any base that fits, through the free list.
    fn find_base(&mut self, labels: &[u8]) -> u32 {
        let first = labels[0] as u32;
        let mut f = self.head;
        while f != NIL {
            let next = self.links[f as usize].1;
            if f >= first && self.fits(f - first, labels) {
                return f - first;
            }
            self.rejects[f as usize] += 1;
            if self.rejects[f as usize] >= MAX_REJECTS {
                self.unlink(f as usize);
            }
            f = next;
        }
        // No room in the array: put the children past its end.
        (self.units.len() as u32).max(first + 1) - first
    }

    /// Places every state depth-first, each state's children as close after
    /// it as they fit: the long single-child chains of a vocabulary then
    /// lie in consecutive units, and a walk down one touches few cache
    /// lines. `keys` are sorted and distinct.
    fn place_all(&mut self, keys: &[(&[u8], u32)]) {
        let mut stack = vec![(0u32, 0usize, keys.len(), 0usize)];
        while let Some((state, lo, hi, depth)) = stack.pop() {
            let mut first = lo;
            if let Some(&(k, v)) = keys.get(lo).filter(|_| lo < hi) {
                if k.len() == depth {
                    let unit = &mut self.units[state as usize];
                    unit.meta = (unit.meta & LABEL_MASK) | (v << VALUE_SHIFT);
                    first += 1;
                }
            }
            if first == hi {
                continue;
            }
            // Group the remaining keys by their byte at `depth`.
            let mut labels = [0u8; 256];
            let mut groups = [(0usize, 0usize); 256];
            let mut n = 0;
            let mut i = first;
            while i < hi {
                let label = keys[i].0[depth];
                let start = i;
                while i < hi && keys[i].0[depth] == label {
                    i += 1;
                }
                labels[n] = label;
                groups[n] = (start, i);
                n += 1;
            }
            let labels = &labels[..n];
            let base = match self.find_base_near(state, labels) {
                Some(base) => base,
                None => self.find_base(labels),
            };
            self.grow(base as usize + 257);
            self.used_base[base as usize] = true;
            self.units[state as usize].base = base;
            for &label in labels {
                self.occupy((base + label as u32) as usize, label);
            }
            // Reversed, so the first child is placed (and laid out) next.
            for (&label, &(start, end)) in labels.iter().zip(&groups[..n]).rev() {
                stack.push((base + label as u32, start, end, depth + 1));
            }
        }
    }

    /// The final array: trimmed after the last state, then a block of 256
    /// unoccupied units that every childless state points into.
    fn finish(mut self) -> Vec<Unit> {
        let last = self
            .units
            .iter()
            .rposition(|u| u.meta & OCCUPIED != 0)
            .unwrap_or(0);
        let max_base = self
            .units
            .iter()
            .map(|u| u.base as usize)
            .max()
            .unwrap_or(0);
        let pad = (last + 1).max(max_base + 256);
        self.units.truncate(pad);
        self.units.resize(pad + 256, EMPTY);
        for u in &mut self.units[..pad] {
            if u.meta & OCCUPIED != 0 && u.base == 0 {
                u.base = pad as u32;
            }
        }
        self.units.shrink_to_fit();
        self.units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[&str]) -> Trie {
        Trie::build(
            keys.iter()
                .enumerate()
                .map(|(i, k)| (k.as_bytes(), i as u32)),
        )
    }

    #[test]
    fn finds_exactly_the_stored_keys() {
        let keys = [
            "a", "ab", "abc", "b", "▁the", "▁th", "x\u{0}y", "ü", "\u{0}",
        ];
        let t = trie(&keys);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k.as_bytes()), Some(i as u32), "{k}");
            let s = t.walk(Trie::ROOT, k.as_bytes()).unwrap();
            assert!(t.is_key(s));
        }
        for k in [
            "",
            "abcd",
            "c",
            "▁t",
            "u",
            "x",
            "x\u{0}",
            "\u{0}\u{0}",
            "ba",
        ] {
            assert_eq!(t.get(k.as_bytes()), None, "{k}");
        }
        assert_eq!(t.max_key_len(), "▁the".len());
    }

    #[test]
    fn last_duplicate_wins_and_empty_keys_are_skipped() {
        let t = Trie::build([(&b"ab"[..], 1), (&b""[..], 2), (&b"ab"[..], 3)]);
        assert_eq!(t.get(b"ab"), Some(3));
        assert_eq!(t.get(b""), None);
    }

    #[test]
    fn every_byte_pair_and_no_false_transitions() {
        let mut keys = Vec::new();
        for a in 0..=255u8 {
            for b in (0..=255u8).step_by(7) {
                keys.push(vec![a, b]);
            }
            keys.push(vec![a]);
        }
        let t = Trie::build(
            keys.iter()
                .enumerate()
                .map(|(i, k)| (k.as_slice(), i as u32)),
        );
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), Some(i as u32));
        }
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let stored = b % 7 == 0;
                assert_eq!(t.get(&[a, b]).is_some(), stored, "{a} {b}");
                for c in [0u8, 1, 255] {
                    assert_eq!(t.get(&[a, b, c]), None);
                }
            }
        }
    }
}
