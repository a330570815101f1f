//! The pool's unit tests: inline claims, budgets and kinds, priority
//! classes, cancelled clients, shutdown.
use super::*;

fn request(
    kind: Kind,
    lengths: &[u32],
) -> (
    Arc<Request>,
    oneshot::Receiver<Result<EmbedResponse, TulipError>>,
) {
    classed(kind, Class::Interactive, lengths)
}

fn classed(
    kind: Kind,
    class: Class,
    lengths: &[u32],
) -> (
    Arc<Request>,
    oneshot::Receiver<Result<EmbedResponse, TulipError>>,
) {
    let (tx, rx) = oneshot::channel();
    let mut offsets = vec![0u32];
    for l in lengths {
        offsets.push(offsets.last().unwrap() + l);
    }
    let n = lengths.len();
    let req = Request {
        kind,
        class,
        dimensions: 4,
        normalize: true,
        raw_scores: false,
        request_id: "r".into(),
        adapter: None,
        token_ids: vec![1; *offsets.last().unwrap() as usize],
        offsets,
        pixels: Default::default(),
        image_bytes: 0,
        arrived: Instant::now(),
        progress: Mutex::new(Progress {
            reply: Some(tx),
            output: Accumulator::new(kind, n, 4),
            remaining: n,
            last_scheduled: None,
            first_launch: None,
        }),
    };
    (Arc::new(req), rx)
}

fn on() -> priority::Settings {
    priority::Settings::default()
}

fn batch(work: Work) -> Vec<SeqRef> {
    match work {
        Work::Batch(seqs, _) => seqs,
        _ => panic!("expected a batch"),
    }
}

#[test]
fn a_lone_request_on_an_idle_engine_runs_inline_and_holds_the_slot() {
    let pool = Pool::new(100, 8, 1, true, on());
    let (a, _ra) = request(Kind::Dense, &[3, 2]);
    match pool.submit(a, true).unwrap() {
        Submitted::Inline(seqs, releases) => {
            assert_eq!(seqs.len(), 2);
            assert!(releases.is_empty());
        }
        Submitted::Queued => panic!("an idle engine should run a lone request inline"),
    }
    assert_eq!(pool.inflight(), 1);
    // While the inline step runs, the next request queues behind it.
    let (b, _rb) = request(Kind::Dense, &[1]);
    assert!(matches!(pool.submit(b, true).unwrap(), Submitted::Queued));
    pool.finish_step(&[], None, None);
    assert_eq!(pool.inflight(), 0);
    assert_eq!(batch(pool.next_work()).len(), 1);
    assert_eq!(pool.inflight(), 1);
}

#[test]
fn concurrent_or_oversized_requests_queue() {
    let pool = Pool::new(4, 8, 1, true, on());
    let (a, _ra) = request(Kind::Dense, &[2]);
    assert!(matches!(pool.submit(a, false).unwrap(), Submitted::Queued));
    // As the service calls it: alone only if an inline candidate.
    let submit_alone = |pool: &Pool, r: Arc<Request>| {
        let alone = pool.inline_candidate(&r);
        pool.submit(r, alone).unwrap()
    };
    let pool = Pool::new(4, 8, 1, true, on());
    let (big, _rb) = request(Kind::Dense, &[3, 3]);
    assert!(matches!(submit_alone(&pool, big), Submitted::Queued));
    let pool = Pool::new(4096, 8, 1, true, on());
    let (long, _rl) = request(Kind::Dense, &[600]);
    assert!(matches!(submit_alone(&pool, long), Submitted::Queued));
    let off = Pool::new(100, 8, 1, false, on());
    let (c, _rc) = request(Kind::Dense, &[2]);
    assert!(matches!(submit_alone(&off, c), Submitted::Queued));
}

#[test]
fn batches_respect_the_budget_and_hold_one_output_kind() {
    let pool = Pool::new(5, 8, 2, false, on());
    let (a, _ra) = request(Kind::Dense, &[2, 2]);
    let (b, _rb) = request(Kind::Dense, &[2]);
    let (c, _rc) = request(Kind::Score, &[1]);
    for r in [a, b, c] {
        pool.submit(r, false).unwrap();
    }
    let first = batch(pool.next_work());
    assert_eq!(first.iter().map(SeqRef::len).sum::<usize>(), 4);
    let second = batch(pool.next_work());
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].request.kind, Kind::Dense);
    pool.finish_step(&[], None, None);
    let third = batch(pool.next_work());
    assert_eq!(third[0].request.kind, Kind::Score);
}

#[test]
fn sequences_of_cancelled_requests_are_skipped() {
    let pool = Pool::new(100, 8, 1, false, on());
    let (gone, rx) = request(Kind::Dense, &[2, 2]);
    let (kept, _rk) = request(Kind::Dense, &[3]);
    pool.submit(gone, false).unwrap();
    pool.submit(kept, false).unwrap();
    drop(rx); // the client went away
    let seqs = batch(pool.next_work());
    assert_eq!(seqs.len(), 1);
    assert_eq!(seqs[0].len(), 3);
}

#[test]
fn shutdown_fails_queued_requests_and_refuses_new_ones() {
    let pool = Pool::new(100, 8, 1, false, on());
    let (a, _ra) = request(Kind::Dense, &[2]);
    pool.submit(a, false).unwrap();
    let running = batch(pool.next_work());
    let (b, mut rb) = request(Kind::Dense, &[2]);
    pool.submit(b, false).unwrap();
    pool.shutdown();
    assert!(matches!(rb.try_recv(), Ok(Err(TulipError::Unavailable(_)))));
    let (c, _rc) = request(Kind::Dense, &[2]);
    assert!(matches!(
        pool.submit(c, true),
        Err(TulipError::Unavailable(_))
    ));
    // The step still in flight finishes and frees its slot.
    drop(running);
    pool.finish_step(&[], None, None);
    assert_eq!(pool.inflight(), 0);
    assert!(matches!(pool.next_work(), Work::Stop(_)));
}

fn lengths(seqs: &[SeqRef]) -> Vec<usize> {
    seqs.iter().map(SeqRef::len).collect()
}

#[test]
fn interactive_sequences_go_first_and_batch_work_fills_the_step() {
    let pool = Pool::new(10, 8, 1, false, on());
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[1]);
    pool.submit(b, false).unwrap();
    pool.submit(i, false).unwrap();
    let first = batch(pool.next_work());
    assert_eq!(first[0].request.class, Class::Interactive);
    assert_eq!(lengths(&first), vec![1, 4, 4]);
}

#[test]
fn with_priorities_off_arrival_order_decides() {
    let off = priority::Settings {
        enabled: false,
        ..on()
    };
    let pool = Pool::new(10, 8, 1, false, off);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[1]);
    pool.submit(b, false).unwrap();
    pool.submit(i, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![4, 4]);
    pool.finish_step(&[], None, None);
    assert_eq!(lengths(&batch(pool.next_work())), vec![4, 1]);
}

#[test]
fn starved_batch_work_takes_the_next_step_first() {
    let settings = priority::Settings {
        batch_max_wait: Duration::from_millis(200),
        ..on()
    };
    let pool = Pool::new(4, 8, 1, false, settings);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4]);
    pool.submit(b, false).unwrap();
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[4, 4]);
    pool.submit(i, false).unwrap();
    // Fresh batch work waits behind interactive work...
    assert_eq!(batch(pool.next_work())[0].request.class, Class::Interactive);
    pool.finish_step(&[], None, None);
    // ...until it has waited `batch_max_wait` without a step.
    std::thread::sleep(Duration::from_millis(250));
    let (j, _rj) = classed(Kind::Dense, Class::Interactive, &[4]);
    pool.submit(j, false).unwrap();
    assert_eq!(batch(pool.next_work())[0].request.class, Class::Batch);
}

#[test]
fn batch_steps_shrink_while_interactive_traffic_is_active() {
    let settings = priority::Settings {
        batch_step_tokens: 8,
        ..on()
    };
    let pool = Pool::new(100, 64, 1, false, settings.clone());
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
    pool.submit(b, false).unwrap();
    // No interactive request seen yet: the full budget.
    let first = batch(pool.next_work());
    assert_eq!(lengths(&first), vec![4, 4, 4, 4]);
    pool.finish_step(&first, None, None);
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[2]);
    pool.submit(i, false).unwrap();
    let (b2, _rb2) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
    pool.submit(b2, false).unwrap();
    // The query first, then batch work up to 8 tokens in all.
    assert_eq!(lengths(&batch(pool.next_work())), vec![2, 4]);
}

#[test]
fn without_filling_a_querys_step_carries_no_batch_work() {
    let settings = priority::Settings {
        interactive_fill: Duration::ZERO,
        ..on()
    };
    let pool = Pool::new(100, 64, 1, false, settings);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4]);
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[2]);
    pool.submit(b, false).unwrap();
    pool.submit(i, false).unwrap();
    let first = batch(pool.next_work());
    assert_eq!(lengths(&first), vec![2]);
    pool.finish_step(&first, None, None);
    assert_eq!(lengths(&batch(pool.next_work())), vec![4, 4]);
}

#[test]
fn a_querys_step_is_filled_only_within_the_batch_step_bound() {
    // No capacity measured yet: the fill falls back to the batch step's
    // token bound, which caps the whole step (query included).
    let settings = priority::Settings {
        interactive_fill: Duration::from_millis(1),
        batch_step_tokens: 9,
        ..on()
    };
    let pool = Pool::new(100, 64, 2, false, settings);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
    let (i, _ri) = classed(Kind::Dense, Class::Interactive, &[3]);
    pool.submit(b, false).unwrap();
    pool.submit(i, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![3, 4]);
    // Interactive work itself is never cut by the batch bound.
    let (j, _rj) = classed(Kind::Dense, Class::Interactive, &[6, 6]);
    pool.submit(j, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![6, 6]);
}

#[test]
fn a_slot_is_kept_for_queries_while_a_batch_step_runs() {
    let settings = priority::Settings {
        batch_inflight: 1,
        interactive_fill: Duration::ZERO,
        ..on()
    };
    let pool = Arc::new(Pool::new(4, 64, 2, false, settings));
    let (warm, _rw) = classed(Kind::Dense, Class::Interactive, &[1]);
    pool.submit(warm, false).unwrap();
    let w = batch(pool.next_work());
    pool.finish_step(&w, None, None); // interactive traffic is now active
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
    pool.submit(b, false).unwrap();
    let running = batch(pool.next_work());
    assert_eq!(lengths(&running), vec![4]);
    // A second batch step would fill the last slot: the scheduler waits...
    let waiter = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || batch(pool.next_work()))
    };
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        pool.inflight(),
        1,
        "a second batch step took the query's slot"
    );
    // ...and a query arriving now is launched at once, in that slot.
    let (q, _rq) = classed(Kind::Dense, Class::Interactive, &[2]);
    pool.submit(q, false).unwrap();
    let step = waiter.join().unwrap();
    assert_eq!(step[0].request.class, Class::Interactive);
    assert_eq!(lengths(&step), vec![2]);
    // Batch work goes on once the running batch step ends.
    pool.finish_step(&running, None, None);
    assert_eq!(lengths(&batch(pool.next_work())), vec![4]);
}

#[test]
fn a_querys_step_takes_its_fill_even_in_the_kept_slot() {
    // No capacity measured yet: the fill falls back to the token bound, 5.
    let settings = priority::Settings {
        batch_inflight: 1,
        batch_step_tokens: 5,
        interactive_fill: Duration::from_millis(1),
        ..on()
    };
    let pool = Pool::new(100, 64, 2, false, settings);
    let (warm, _rw) = classed(Kind::Dense, Class::Interactive, &[1]);
    pool.submit(warm, false).unwrap();
    let w = batch(pool.next_work());
    pool.finish_step(&w, None, None);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
    pool.submit(b, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![4]);
    let (q, _rq) = classed(Kind::Dense, Class::Interactive, &[1]);
    pool.submit(q, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![1, 4]);
}

#[test]
fn a_batch_step_launched_ahead_takes_one_slot_more_but_only_when_due() {
    let settings = priority::Settings {
        batch_inflight: 1,
        launch_ahead: true,
        interactive_fill: Duration::ZERO,
        ..on()
    };
    let pool = Pool::new(4, 64, 2, false, settings);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4, 4]);
    pool.submit(b, false).unwrap();
    // A first batch step measures the device: 4 tokens in 50 ms.
    let first = batch(pool.next_work());
    let t = Instant::now();
    pool.on_device(&first, t);
    std::thread::sleep(Duration::from_millis(50));
    pool.finish_step(&first, None, Some((t, true)));
    // A query makes interactive traffic active.
    let (q, _rq) = classed(Kind::Dense, Class::Interactive, &[2]);
    pool.submit(q, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![2]);
    // One batch step runs (~50 ms at that pace); the query holds the kept slot.
    let running = batch(pool.next_work());
    assert_eq!(lengths(&running), vec![4]);
    let on = Instant::now();
    pool.on_device(&running, on);
    assert_eq!(pool.inflight(), 2);
    // The next batch step goes in one slot more, when the running one is
    // about to end: not before.
    let ahead = batch(pool.next_work());
    assert_eq!(lengths(&ahead), vec![4]);
    assert!(
        on.elapsed() >= Duration::from_millis(30),
        "launched ahead too early"
    );
    assert_eq!(pool.inflight(), 3);
}

#[test]
fn without_queries_batch_steps_use_every_slot() {
    let settings = priority::Settings {
        batch_inflight: 1,
        ..on()
    };
    let pool = Pool::new(4, 64, 2, false, settings);
    let (b, _rb) = classed(Kind::Dense, Class::Batch, &[4, 4, 4]);
    pool.submit(b, false).unwrap();
    assert_eq!(lengths(&batch(pool.next_work())), vec![4]);
    assert_eq!(lengths(&batch(pool.next_work())), vec![4]);
    assert_eq!(pool.inflight(), 2);
}
