//! Counts heap allocations per `encode_into` call once warm: zero, for every
//! tokenizer the in-house pipeline handles, on every corpus line, single and
//! as pairs, with and without truncation. (Its own test binary: it installs
//! a counting global allocator.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{corpus_lines, IN_HOUSE};
use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};

struct Counting;

thread_local! {
    /// Allocations made by this thread (tests run on several threads).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may be gone while a thread shuts down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to the system allocator with the same
// arguments; counting touches no memory it hands out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn options() -> [EncodeOptions; 3] {
    [
        EncodeOptions::default(),
        EncodeOptions {
            add_special_tokens: true,
            max_length: Some(16),
            direction: Direction::Left,
        },
        EncodeOptions {
            add_special_tokens: false,
            max_length: Some(7),
            direction: Direction::Right,
        },
    ]
}

/// Encodes every line (and pairs of neighbours) with every option set.
fn encode_all(tok: &Tokenizer, lines: &[String], out: &mut Encoding) -> usize {
    let mut calls = 0;
    for opts in options() {
        for (i, line) in lines.iter().enumerate() {
            tok.encode_into(line, &opts, out).unwrap();
            let next = &lines[(i + 1) % lines.len()];
            tok.encode_pair_into(line, Some(next), &opts, out).unwrap();
            calls += 2;
        }
    }
    calls
}

fn run(name: &str) {
    let tok = Tokenizer::from_file(common::tokenizer_path(name)).unwrap();
    assert!(matches!(tok.backend(), ivy_tokenizer::Backend::InHouse(_)));
    let lines = corpus_lines();
    let mut out = Encoding::default();
    // Warm-up: buffers grow to the largest input once.
    encode_all(&tok, &lines, &mut out);
    let before = allocations();
    let calls = encode_all(&tok, &lines, &mut out);
    let after = allocations();
    assert_eq!(
        after - before,
        0,
        "{name}: {} allocations in {calls} warm calls",
        after - before
    );
    // The counter does see this thread's allocations.
    let probe = allocations();
    drop(std::hint::black_box(vec![0u8; 64]));
    assert_eq!(allocations(), probe + 1);
}

#[test]
fn xlm_roberta_allocates_nothing_once_warm() {
    run(IN_HOUSE[0]);
}

#[test]
fn mon_unigram_allocates_nothing_once_warm() {
    run(IN_HOUSE[1]);
}

#[test]
fn spm_test_en_allocates_nothing_once_warm() {
    run(IN_HOUSE[2]);
}

#[test]
fn spm_test_ja_allocates_nothing_once_warm() {
    run(IN_HOUSE[3]);
}

#[test]
fn all_minilm_allocates_nothing_once_warm() {
    run(IN_HOUSE[4]);
}
