//! The storage device: when reads of given sizes complete.
//!
//! Throughput comes from the profile's measured tables (MB/s by read size and queue depth),
//! interpolated linearly in log(size) and clamped at the ends; among the measured queue depths
//! the largest one not above the reads in flight is used (the smallest when all are above).
//! With `d` reads in flight the device's throughput is shared, so one read of `s` bytes takes
//! `max(latency, d · s / throughput(s, d))`: the tables already include per-read latency, and
//! `latency_us` is the floor for reads smaller than anything measured.
//!
//! A `single_queue` device (UFS: one command queue) serves reads one at a time in submission
//! order. Otherwise up to `io_threads × queue_depth` reads (the plan's storage settings) are in
//! flight; a read waits for the earliest free slot (ties: lowest slot) and its service time is
//! fixed when it starts, from the reads in flight then (not processor sharing: a large read
//! started beside small ones keeps its small share after they finish, which errs slow).
//!
//! The scheduler does not issue loads yet; the beyond-memory issue adds `Load`/`Loaded` and
//! drives [`StorageModel::submit`] from the event loop.

use conductor_runtime::plan::{StoragePlan, StorageProfile, StorageRate};

/// How a read is placed relative to the previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Scattered reads (cold neuron bundles): the `random` table.
    Random,
    /// Consecutive reads (a layer's weights, read ahead): the `sequential` table.
    Sequential,
}

/// When one read was served, virtual nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadTiming {
    pub submitted_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Throughput by size at one queue depth: (ln size, MB/s), ascending in size.
#[derive(Clone, Debug)]
struct Curve {
    depth: u32,
    points: Vec<(f64, f64)>,
}

fn curves(rates: &[StorageRate]) -> Vec<Curve> {
    let mut depths: Vec<u32> = rates.iter().map(|r| r.queue_depth).collect();
    depths.sort_unstable();
    depths.dedup();
    depths
        .into_iter()
        .map(|depth| {
            let mut points: Vec<(f64, f64)> = rates
                .iter()
                .filter(|r| r.queue_depth == depth)
                .map(|r| ((r.size_bytes.max(1) as f64).ln(), r.mbps))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Curve { depth, points }
        })
        .collect()
}

impl Curve {
    fn at(&self, ln_size: f64) -> f64 {
        let p = &self.points;
        let i = p.partition_point(|&(x, _)| x < ln_size);
        if i == 0 {
            return p[0].1;
        }
        if i == p.len() {
            return p[p.len() - 1].1;
        }
        let ((x0, y0), (x1, y1)) = (p[i - 1], p[i]);
        if x1 == x0 {
            return y1;
        }
        y0 + (y1 - y0) * (ln_size - x0) / (x1 - x0)
    }
}

/// Throughput a single command queue loses to several issuing threads (PowerInfer-2: "up to
/// 40%"; the bound is taken).
pub const SHARED_QUEUE_LOSS: f64 = 0.4;

/// A storage device on virtual time.
#[derive(Clone, Debug)]
pub struct StorageModel {
    single_queue: bool,
    latency_ns: f64,
    random: Vec<Curve>,
    sequential: Vec<Curve>,
    /// When each command slot is next free.
    slots: Vec<u64>,
    /// Service-time factor of several threads issuing to one command queue.
    issuer_penalty: f64,
    bytes_read: u64,
    reads: u64,
    busy_ns: u64,
    /// Time at least one read was in flight, and when the last read in flight ends.
    active_ns: u64,
    active_until: u64,
    /// An issuing thread idle longer than `.0` ns has parked: a read given to it starts `.1`
    /// ns later ([`StorageModel::with_wakeups`]).
    wakeup: Option<(u64, u64)>,
}

impl StorageModel {
    /// A device as `profile` measured it, read the way `plan` says. Rates are taken as
    /// `HardwareProfile::validate` leaves them (positive); an empty table costs latency only.
    pub fn new(profile: &StorageProfile, plan: &StoragePlan) -> StorageModel {
        // One command queue (UFS, eMMC): it holds one issuer's `queue_depth` reads whatever
        // the number of threads, and several issuing threads cost throughput (PowerInfer-2:
        // I/O from several cores loses up to 40%).
        let (slots, issuer_penalty) = if profile.single_queue {
            let penalty = if plan.io_threads > 1 {
                1.0 / (1.0 - SHARED_QUEUE_LOSS)
            } else {
                1.0
            };
            (plan.queue_depth.max(1) as usize, penalty)
        } else {
            (
                (plan.io_threads.max(1) * plan.queue_depth.max(1)) as usize,
                1.0,
            )
        };
        StorageModel {
            single_queue: profile.single_queue,
            latency_ns: profile.latency_us * 1e3,
            random: curves(&profile.random),
            sequential: curves(&profile.sequential),
            slots: vec![0; slots],
            issuer_penalty,
            bytes_read: 0,
            reads: 0,
            busy_ns: 0,
            active_ns: 0,
            active_until: 0,
            wakeup: None,
        }
    }

    /// Reads given to an issuing thread that has been idle longer than `spin_window_ns` wait
    /// `wakeup_ns` for it to wake (the engine's storage threads park like its other hosts).
    pub fn with_wakeups(mut self, spin_window_ns: u64, wakeup_ns: u64) -> StorageModel {
        self.wakeup = Some((spin_window_ns, wakeup_ns));
        self
    }

    /// Reads the device serves at once.
    pub fn queue_depth(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn single_queue(&self) -> bool {
        self.single_queue
    }

    /// Throughput (MB/s) of reads of `bytes` with `depth` reads in flight.
    pub fn throughput_mbps(&self, access: Access, bytes: u64, depth: u32) -> f64 {
        let table = match access {
            Access::Random => &self.random,
            Access::Sequential => &self.sequential,
        };
        let Some(curve) = table
            .iter()
            .rev()
            .find(|c| c.depth <= depth)
            .or(table.first())
        else {
            // Nothing measured (an unvalidated profile): reads cost their latency only.
            return f64::INFINITY;
        };
        curve.at((bytes.max(1) as f64).ln())
    }

    /// Nanoseconds one read of `bytes` takes with `depth` reads (itself included) in flight.
    pub fn service_ns(&self, access: Access, bytes: u64, depth: u32) -> u64 {
        let depth = depth.max(1);
        // MB/s = 10^6 bytes/s = 10^-3 bytes/ns.
        let mbps = self.throughput_mbps(access, bytes, depth);
        let transfer = bytes as f64 * f64::from(depth) * 1e3 / mbps * self.issuer_penalty;
        transfer.max(self.latency_ns).round() as u64
    }

    /// Submits a read at `now_ns`; returns when it starts and completes. Reads must be
    /// submitted in nondecreasing `now_ns` order (the event loop's order).
    pub fn submit(&mut self, now_ns: u64, bytes: u64, access: Access) -> ReadTiming {
        let mut slot = 0;
        for (i, &free) in self.slots.iter().enumerate() {
            if free < self.slots[slot] {
                slot = i;
            }
        }
        let free = self.slots[slot];
        let start = match self.wakeup {
            Some((spin, wake)) if now_ns.saturating_sub(free) > spin => now_ns + wake,
            _ => now_ns.max(free),
        };
        let in_flight = self.slots.iter().filter(|&&free| free > start).count() as u32;
        let service = self.service_ns(access, bytes, in_flight + 1);
        let end = start + service;
        self.slots[slot] = end;
        self.bytes_read += bytes;
        self.reads += 1;
        self.busy_ns += service;
        // Starts never go back (submissions are in time order and the earliest free slot
        // only moves later), so the union of read intervals grows at its end.
        self.active_ns += end.saturating_sub(start.max(self.active_until));
        self.active_until = self.active_until.max(end);
        ReadTiming {
            submitted_ns: now_ns,
            start_ns: start,
            end_ns: end,
        }
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Sum of the service times of every read (overlapping reads count each).
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// Time at least one read was in flight (overlapping reads count once).
    pub fn active_ns(&self) -> u64 {
        self.active_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rate(size_bytes: u64, queue_depth: u32, mbps: f64) -> StorageRate {
        StorageRate {
            size_bytes,
            queue_depth,
            mbps,
        }
    }

    fn profile(single_queue: bool) -> StorageProfile {
        StorageProfile {
            name: "ufs".into(),
            single_queue,
            latency_us: 50.0,
            random: vec![
                rate(4096, 1, 40.0),
                rate(65536, 1, 400.0),
                rate(4096, 8, 200.0),
                rate(65536, 8, 1600.0),
            ],
            sequential: vec![rate(1 << 20, 1, 3000.0), rate(1 << 16, 1, 1000.0)],
        }
    }

    fn plan(io_threads: u32, queue_depth: u32) -> StoragePlan {
        StoragePlan {
            io_threads,
            queue_depth,
            direct_io: true,
            engine: Default::default(),
            verify: Default::default(),
        }
    }

    #[test]
    fn throughput_interpolates_in_log_size_and_clamps() {
        let s = StorageModel::new(&profile(false), &plan(1, 8));
        // 16 KiB is halfway between 4 KiB and 64 KiB in log(size).
        assert!((s.throughput_mbps(Access::Random, 16384, 1) - 220.0).abs() < 1e-9);
        assert_eq!(s.throughput_mbps(Access::Random, 512, 1), 40.0);
        assert_eq!(s.throughput_mbps(Access::Random, 1 << 30, 1), 400.0);
        // Depth 4 uses the depth-1 rows, depth 8 and above the depth-8 rows.
        assert_eq!(s.throughput_mbps(Access::Random, 4096, 4), 40.0);
        assert_eq!(s.throughput_mbps(Access::Random, 4096, 32), 200.0);
        // Unsorted table rows are sorted.
        assert_eq!(s.throughput_mbps(Access::Sequential, 1 << 16, 1), 1000.0);
    }

    #[test]
    fn a_parked_issuer_wakes_before_its_read() {
        let mut s = StorageModel::new(&profile(true), &plan(1, 1)).with_wakeups(5_000, 30_000);
        // 64 KiB at 400 MB/s: 163 840 ns.
        let first = s.submit(0, 65536, Access::Random);
        assert_eq!((first.start_ns, first.end_ns), (0, 163_840));
        // Queued behind it, or given just after it ends (within the spin window): no wake-up.
        assert_eq!(s.submit(100, 65536, Access::Random).start_ns, 163_840);
        assert_eq!(s.submit(330_000, 65536, Access::Random).start_ns, 330_000);
        // Idle longer than the window: the thread parked, the read waits for it to wake.
        let late = s.submit(1_000_000, 65536, Access::Random);
        assert_eq!(late.start_ns, 1_030_000);
        // Without wake-ups the same read starts at once.
        let mut plain = StorageModel::new(&profile(true), &plan(1, 1));
        plain.submit(0, 65536, Access::Random);
        assert_eq!(
            plain.submit(1_000_000, 65536, Access::Random).start_ns,
            1_000_000
        );
    }

    #[test]
    fn service_time_has_a_latency_floor() {
        let s = StorageModel::new(&profile(true), &plan(1, 1));
        assert_eq!(s.service_ns(Access::Random, 64, 1), 50_000);
        // 64 KiB at 400 MB/s = 163.84 µs.
        assert_eq!(s.service_ns(Access::Random, 65536, 1), 163_840);
    }

    #[test]
    fn an_empty_table_costs_latency_only() {
        let mut p = profile(true);
        p.sequential.clear();
        let s = StorageModel::new(&p, &plan(1, 1));
        assert_eq!(s.service_ns(Access::Sequential, 1 << 20, 1), 50_000);
    }

    #[test]
    fn larger_reads_get_more_throughput() {
        let s = StorageModel::new(&profile(false), &plan(1, 1));
        let mut last = 0.0;
        for size in [4096u64, 8192, 16384, 32768, 65536] {
            let bytes_per_ns = size as f64 / s.service_ns(Access::Random, size, 1) as f64;
            assert!(bytes_per_ns > last, "{size}: {bytes_per_ns} <= {last}");
            last = bytes_per_ns;
        }
    }

    #[test]
    fn a_single_queue_holds_one_issuers_reads_and_more_threads_lose() {
        // Four threads, one read each in flight: one command queue serves them in order, at
        // the shared-queue loss.
        let mut s = StorageModel::new(&profile(true), &plan(4, 1));
        assert_eq!(s.queue_depth(), 1);
        let one = s.service_ns(Access::Random, 65536, 1);
        let alone = StorageModel::new(&profile(true), &plan(1, 1));
        let single = alone.service_ns(Access::Random, 65536, 1);
        assert_eq!(
            one,
            (single as f64 / (1.0 - SHARED_QUEUE_LOSS)).round() as u64
        );
        let t: Vec<ReadTiming> = (0..4).map(|_| s.submit(0, 65536, Access::Random)).collect();
        for (i, r) in t.iter().enumerate() {
            assert_eq!(r.start_ns, i as u64 * one);
            assert_eq!(r.end_ns, (i as u64 + 1) * one);
        }
        assert_eq!(s.bytes_read(), 4 * 65536);
        assert_eq!(s.reads(), 4);
        // One issuer keeping 8 reads in flight fills 8 of the queue's slots.
        assert_eq!(
            StorageModel::new(&profile(true), &plan(1, 8)).queue_depth(),
            8
        );
        assert_eq!(
            StorageModel::new(&profile(true), &plan(2, 8)).queue_depth(),
            8
        );
        assert_eq!(
            StorageModel::new(&profile(false), &plan(2, 8)).queue_depth(),
            16
        );
    }

    #[test]
    fn a_deep_queue_overlaps_reads_and_finishes_sooner() {
        let mut single = StorageModel::new(&profile(true), &plan(1, 1));
        let mut deep = StorageModel::new(&profile(false), &plan(1, 8));
        assert_eq!(deep.queue_depth(), 8);
        let done = |s: &mut StorageModel| {
            (0..8)
                .map(|_| s.submit(0, 4096, Access::Random).end_ns)
                .max()
                .unwrap()
        };
        let (a, b) = (done(&mut single), done(&mut deep));
        assert!(b < a, "deep queue {b} ns, single queue {a} ns");
        // A ninth read waits for the first free slot.
        let r = deep.submit(0, 4096, Access::Random);
        assert!(r.start_ns > 0);
    }

    proptest! {
        #[test]
        fn single_queue_reads_never_overlap(
            reads in proptest::collection::vec((0u64..1_000_000, 1u64..(1 << 22), any::<bool>()), 1..40)
        ) {
            let mut reads = reads;
            reads.sort_by_key(|r| r.0);
            let mut s = StorageModel::new(&profile(true), &plan(2, 1));
            let mut last_end = 0;
            for (now, bytes, seq) in reads {
                let access = if seq { Access::Sequential } else { Access::Random };
                let r = s.submit(now, bytes, access);
                prop_assert!(r.start_ns >= now.max(last_end));
                prop_assert!(r.end_ns > r.start_ns);
                last_end = r.end_ns;
            }
        }

        /// Active time is the length of the union of the read intervals: never more than the
        /// span of the run, never less than the longest read, the sum of service times with a
        /// single slot.
        #[test]
        fn active_time_is_the_union_of_reads(
            reads in proptest::collection::vec((0u64..2_000_000, 1u64..(1 << 20)), 1..40),
            depth in 1u32..9,
        ) {
            let mut reads = reads;
            reads.sort_by_key(|r| r.0);
            let mut s = StorageModel::new(&profile(false), &plan(1, depth));
            let mut intervals: Vec<(u64, u64)> = reads
                .iter()
                .map(|&(now, bytes)| {
                    let r = s.submit(now, bytes, Access::Random);
                    (r.start_ns, r.end_ns)
                })
                .collect();
            intervals.sort();
            let (mut union, mut until) = (0, 0);
            for (a, b) in intervals {
                union += b.saturating_sub(a.max(until));
                until = until.max(b);
            }
            prop_assert_eq!(s.active_ns(), union);
            prop_assert!(s.active_ns() <= s.busy_ns());
            if depth == 1 {
                prop_assert_eq!(s.active_ns(), s.busy_ns());
            }
        }

        /// For reads of one size, since the tables' throughput does not fall with depth.
        /// (Mixed sizes can lose: a read's share is fixed when it starts.)
        #[test]
        fn a_deeper_queue_is_never_later(size in 1u64..(1 << 20), n in 1usize..30) {
            let mut single = StorageModel::new(&profile(true), &plan(1, 1));
            let mut deep = StorageModel::new(&profile(false), &plan(1, 8));
            let a = (0..n).map(|_| single.submit(0, size, Access::Random).end_ns).max();
            let b = (0..n).map(|_| deep.submit(0, size, Access::Random).end_ns).max();
            // Service times are rounded to whole ns per read.
            prop_assert!(b.unwrap() <= a.unwrap() + n as u64);
        }
    }
}
