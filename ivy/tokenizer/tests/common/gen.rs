//! A deterministic generator of hostile text: mixed scripts, combining
//! marks, emoji and ZWJ sequences, CJK, right-to-left text, control and
//! zero-width chars, whitespace runs, long repeats, very long words, special
//! token strings, arbitrary code points, and empty strings.

/// SplitMix64: small, fast, and reproducible from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn char_in(&mut self, lo: u32, hi: u32) -> char {
        loop {
            if let Some(c) = char::from_u32(lo + self.below((hi - lo + 1) as usize) as u32) {
                return c;
            }
        }
    }
}

/// Code point ranges by family, sampled uniformly within a range.
const RANGES: &[(u32, u32)] = &[
    (0x61, 0x7A),       // a-z
    (0x41, 0x5A),       // A-Z
    (0x30, 0x39),       // digits
    (0x21, 0x2F),       // ASCII punctuation
    (0xC0, 0x17F),      // Latin-1, Latin Extended-A
    (0x300, 0x36F),     // combining diacritics
    (0x370, 0x3FF),     // Greek
    (0x400, 0x4FF),     // Cyrillic
    (0x590, 0x5FF),     // Hebrew
    (0x600, 0x6FF),     // Arabic
    (0x900, 0x97F),     // Devanagari (vowel signs, virama)
    (0x980, 0x9FF),     // Bengali
    (0xE00, 0xE7F),     // Thai
    (0x1100, 0x11FF),   // Hangul jamo
    (0x3040, 0x30FF),   // Hiragana, Katakana
    (0x4E00, 0x9FFF),   // CJK ideographs
    (0xAC00, 0xD7A3),   // Hangul syllables
    (0xFF01, 0xFF9F),   // full-width ASCII, half-width katakana
    (0xFB00, 0xFB4F),   // ligatures, Hebrew presentation forms
    (0xFE70, 0xFEFF),   // Arabic presentation forms
    (0x2150, 0x218F),   // number forms (Ⅻ)
    (0x3300, 0x33FF),   // CJK compatibility (㎞)
    (0x1F300, 0x1F6FF), // emoji
    (0x1F900, 0x1F9FF), // more emoji
    (0x1F1E6, 0x1F1FF), // regional indicators (flags)
    (0x20000, 0x2A6DF), // CJK extension B
    (0xE000, 0xF8FF),   // private use
];

/// Single chars that break naive code: controls, zero-width and direction
/// marks, odd whitespace, the replacement char, the SentencePiece space.
const ODD: &[char] = &[
    '\0',
    '\u{1}',
    '\u{7}',
    '\u{8}',
    '\t',
    '\n',
    '\u{B}',
    '\u{C}',
    '\r',
    '\u{1B}',
    '\u{7F}',
    '\u{85}',
    '\u{9F}',
    '\u{A0}',
    '\u{AD}',
    '\u{34F}',
    '\u{61C}',
    '\u{1680}',
    '\u{180E}',
    '\u{2000}',
    '\u{2007}',
    '\u{200A}',
    '\u{200B}',
    '\u{200C}',
    '\u{200D}',
    '\u{200E}',
    '\u{200F}',
    '\u{2028}',
    '\u{2029}',
    '\u{202A}',
    '\u{202E}',
    '\u{202F}',
    '\u{205F}',
    '\u{2060}',
    '\u{2066}',
    '\u{2069}',
    '\u{3000}',
    '\u{FE0F}',
    '\u{FEFF}',
    '\u{FFFD}',
    '\u{2581}',
    '\u{1F3FB}',
    '\u{E0001}',
    '\u{10FFFF}',
    'İ',
    'ß',
    'ﬃ',
    'Ω',
    'K',
];

/// Multi-char pieces: special token strings and grapheme clusters.
const PIECES: &[&str] = &[
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<mask>",
    "[CLS]",
    "[SEP]",
    "[UNK]",
    "[MASK]",
    "[PAD]",
    "<s",
    "s>",
    "<<s>>",
    "\u{2581}\u{2581}",
    "▁the",
    "##ing",
    "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}\u{200D}\u{1F466}", // family
    "\u{1F44D}\u{1F3FD}",                                           // thumbs up, skin tone
    "\u{1F1EF}\u{1F1F5}",                                           // flag
    "\u{2764}\u{FE0F}",
    "e\u{301}\u{323}\u{302}", // stacked accents, unsorted
    "\u{915}\u{94D}\u{937}",  // Devanagari conjunct
    "\u{E01}\u{E33}",
    "\u{FF8A}\u{FF9F}",
    "\r\n",
    "ﾊﾟ",
    "ｶﾞ",
    "ＡＢＣ",
    "①②",
    "ﬁ",
    "™",
    "…",
    "\u{1100}\u{1161}\u{11A8}", // Hangul jamo syllable
    "ٱلْعَرَبِيَّة",
    "שָׁלוֹם",
    "नमस्ते",
    "สวัสดี",
    "日本語",
    "한국어",
    "Привет",
    "Ελληνικά",
];

fn push_char(rng: &mut Rng, out: &mut String) {
    match rng.below(10) {
        0..=5 => {
            let &(lo, hi) = rng.pick(RANGES);
            out.push(rng.char_in(lo, hi));
        }
        6 | 7 => out.push(*rng.pick(ODD)),
        8 => {
            let piece: &&str = rng.pick(PIECES);
            out.push_str(piece);
        }
        // Any scalar value, assigned or not.
        _ => out.push(rng.char_in(0, 0x10FFFF)),
    }
}

fn push_word(rng: &mut Rng, out: &mut String) {
    // Words mostly from one family, as real text is.
    let &(lo, hi) = rng.pick(RANGES);
    for _ in 0..1 + rng.below(8) {
        if rng.chance(80) {
            out.push(rng.char_in(lo, hi));
        } else {
            push_char(rng, out);
        }
    }
}

/// One test string.
pub fn text(rng: &mut Rng) -> String {
    let mut s = String::new();
    match rng.below(100) {
        // Empty, or only whitespace.
        0..=2 => {}
        3..=5 => {
            for _ in 0..rng.below(40) {
                s.push(*rng.pick(&[' ', ' ', '\t', '\n', '\u{A0}', '\u{3000}', '\r']));
            }
        }
        // One char repeated many times.
        6..=8 => {
            let mut one = String::new();
            push_char(rng, &mut one);
            let n = 50 + rng.below(600);
            if rng.chance(50) {
                s.push_str("x ");
            }
            s.push_str(&one.repeat(n));
        }
        // A very long word.
        9..=11 => {
            for _ in 0..rng.below(3) {
                push_word(rng, &mut s);
                s.push(' ');
            }
            let &(lo, hi) = rng.pick(RANGES);
            for _ in 0..90 + rng.below(300) {
                s.push(rng.char_in(lo, hi));
            }
        }
        // Arbitrary chars with no structure.
        12..=29 => {
            for _ in 0..rng.below(30) {
                push_char(rng, &mut s);
            }
        }
        // Sentences: words separated by whitespace runs and punctuation.
        _ => {
            for _ in 0..1 + rng.below(14) {
                push_word(rng, &mut s);
                match rng.below(10) {
                    0 => s.push_str("  "),
                    1 => s.push(*rng.pick(&['.', ',', '!', '?', '。', '،', '-', '\''])),
                    2 => push_char(rng, &mut s),
                    3 => s.push_str(&" ".repeat(rng.below(20))),
                    _ => s.push(' '),
                }
            }
        }
    }
    s
}
