//! The strings of a vocabulary in one buffer, indexed by id.

#[derive(Debug, Default, Clone)]
pub(crate) struct Pieces {
    text: String,
    /// Byte range of each id's string in `text`; `None` for unused ids.
    spans: Vec<Option<(u32, u32)>>,
}

impl Pieces {
    /// Builds from `(id, string)` pairs; a later pair for the same id wins.
    pub(crate) fn new<'a>(entries: impl IntoIterator<Item = (u32, &'a str)>) -> Self {
        let mut p = Self::default();
        for (id, s) in entries {
            let id = id as usize;
            if p.spans.len() <= id {
                p.spans.resize(id + 1, None);
            }
            let start = p.text.len() as u32;
            p.text.push_str(s);
            p.spans[id] = Some((start, p.text.len() as u32));
        }
        p.text.shrink_to_fit();
        p
    }

    pub(crate) fn get(&self, id: u32) -> Option<&str> {
        let (s, e) = (*self.spans.get(id as usize)?)?;
        Some(&self.text[s as usize..e as usize])
    }

    /// Bytes of memory held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.text.capacity() + self.spans.capacity() * std::mem::size_of::<Option<(u32, u32)>>()
    }
}
