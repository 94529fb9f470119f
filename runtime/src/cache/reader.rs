//! Reading units from a neuron store into cache slots: one positional read per unit (or,
//! with `storage.engine = "uring"`, io_uring reads), on `O_DIRECT` when the file system
//! allows, retried once. What is read is checked against the store's checksums as the plan's
//! `storage.verify` says ([`Verify`]): every read (whole bundles against their CRC-32, parts of
//! bundles and attention and output units page by page), or a unit's first whole read only. A
//! read that fails its check counts as a failed read: it is read again once, then is an error.

use super::UnitMap;
use crate::model::Model;
use crate::plan::{IoEngine, StoragePlan, Verify};
use crate::read_faults::{ReadFault, ReadFaults};
use crate::store::StoreInfo;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Alignment of reads (what `O_DIRECT` asks of offsets and lengths).
const READ_ALIGN: u64 = 4096;

/// A unit that could not be loaded: which layer and neurons (or output rows), and why.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("loading {what} from {path}: {why}")]
pub struct LoadError {
    /// `layer 3 neurons 0..128` or `output rows 0..224`.
    pub what: String,
    pub path: String,
    pub why: String,
}

/// How one unit is read: `len` bytes at `offset` (both aligned), its data at `data` within
/// the slot, and the bundle whose checksum covers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: usize,
    pub data: Range<usize>,
    pub what: String,
    /// (layer, bundle) of a store bundle, checked against its bundle CRC; other units are
    /// checked against the store's page CRCs.
    pub bundle: Option<(u32, u32)>,
}

/// The reads of every unit of `map` in `model` (a neuron store), in unit order; output
/// clusters hold `output_rows` rows of the output projection.
pub fn unit_extents(model: &Model, map: &UnitMap, output_rows: u32) -> Vec<Extent> {
    let mut out = Vec::with_capacity(map.n_units() as usize);
    let Some(store) = model.store() else {
        return out;
    };
    for (l, layer) in model.layers().iter().enumerate() {
        let layout = store.layout_of(l as u32);
        if map.attn_units > 0 {
            for (name, t) in [
                ("attn_q", &layer.wq),
                ("attn_k", &layer.wk),
                ("attn_v", &layer.wv),
                ("attn_output", &layer.wo),
            ] {
                out.push(rows_extent(
                    t,
                    0..t.rows as u64,
                    format!("layer {l} {name}"),
                ));
            }
        }
        let base = layer.bundles.as_ref().map_or(0, |r| r.start as u64);
        for b in 0..map.ffn_clusters {
            let neurons = layout.neurons_of(b);
            // A layer whose down part is narrower than the stride's (mixed down types) reads
            // its payload's pages, not the padding after them.
            let payload = layout.payload_bytes(neurons.len() as u32);
            let pages = (payload as u64).div_ceil(crate::store::STORE_ALIGN);
            out.push(Extent {
                offset: base + u64::from(b) * layout.stride,
                len: (pages * crate::store::STORE_ALIGN).min(layout.stride) as usize,
                data: 0..payload,
                what: format!("layer {l} neurons {}..{}", neurons.start, neurons.end),
                bundle: Some((l as u32, b)),
            });
        }
    }
    let t = model.output();
    for c in 0..map.output_clusters {
        let first = u64::from(c * output_rows);
        let end_row = (first + u64::from(output_rows)).min(t.rows as u64);
        out.push(rows_extent(
            t,
            first..end_row,
            format!("output rows {first}..{end_row}"),
        ));
    }
    out
}

/// The length of the aligned read that covers the file bytes `bytes`.
pub(crate) fn read_len(bytes: &Range<usize>) -> u64 {
    let offset = bytes.start as u64 / READ_ALIGN * READ_ALIGN;
    (bytes.end as u64).div_ceil(READ_ALIGN) * READ_ALIGN - offset
}

/// The read of rows `rows` of tensor `t`: widened to aligned offsets, the rows' bytes inside.
fn rows_extent(t: &crate::model::TensorRef, rows: Range<u64>, what: String) -> Extent {
    let rb = t.row_bytes() as u64;
    let start = t.bytes.start as u64 + rows.start * rb;
    let end = t.bytes.start as u64 + rows.end * rb;
    let offset = start / READ_ALIGN * READ_ALIGN;
    let stop = end.div_ceil(READ_ALIGN) * READ_ALIGN;
    Extent {
        offset,
        len: (stop - offset) as usize,
        data: (start - offset) as usize..(end - offset) as usize,
        what,
        bundle: None,
    }
}

/// A neuron store opened for unit reads.
pub struct BundleFile {
    path: PathBuf,
    file: File,
    store: StoreInfo,
    map: UnitMap,
    extents: Vec<Extent>,
    /// Units whose checksum a whole read already confirmed: under [`Verify::First`] later
    /// reads of them are only checked for length; under either policy a bundle's pages may be
    /// read on their own once it is set ([`BundleFile::part_ready`]).
    verified: Vec<AtomicBool>,
    verify: Verify,
    reads: Reads,
    /// Fault injection (the fault harness and tests): sees every read first. `None` in
    /// normal runs.
    faults: Option<Arc<dyn ReadFaults>>,
    /// What reached the kernel: read requests and the submissions that carried them.
    issued: IssuedReads,
}

/// Read requests handed to the kernel (one `pread`/`preadv`, or one io_uring entry, each) and
/// the submissions that carried them (one system call each: a positional read, or one ring
/// batch of up to [`super::uring::RING_ENTRIES`] entries). Requests per submission is the queue
/// depth the device was offered, which is what its read curve is measured against.
#[derive(Debug, Default)]
struct IssuedReads {
    requests: AtomicU64,
    submissions: AtomicU64,
}

/// A snapshot of [`BundleFile::issued`]: read requests and submissions so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IssuedCounts {
    pub requests: u64,
    pub submissions: u64,
}

impl IssuedReads {
    fn note(&self, requests: usize, submissions: usize) {
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
        self.submissions
            .fetch_add(submissions as u64, Ordering::Relaxed);
    }

    /// A ring batch of `n` reads: `n` requests in `ceil(n / RING_ENTRIES)` submissions.
    #[cfg(feature = "io-uring")]
    fn note_ring(&self, n: usize) {
        self.note(n, n.div_ceil(super::uring::RING_ENTRIES as usize));
    }
}

/// How reads reach the kernel.
enum Reads {
    /// `pread` (one unit) and `preadv` (a run of adjacent units).
    Positional,
    /// io_uring: every unit of a run its own read, all in flight together.
    #[cfg(feature = "io-uring")]
    Uring(Box<super::uring::Ring>),
}

/// What [`BundleFile::open`] can fail with.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("io_uring is not available here ({0}); use --io-engine pread")]
    UringUnavailable(std::io::Error),
    #[error(
        "this build has no io_uring (build with `--features io-uring`); use --io-engine pread"
    )]
    UringNotBuilt,
}

impl BundleFile {
    /// Opens the store `model` was loaded from for the units `extents` describe, with
    /// `O_DIRECT` if `direct` and the file system accepts it, read through `engine`, every
    /// read checked. `None` when the model is not a store.
    pub fn open(
        path: &Path,
        model: &Model,
        map: &UnitMap,
        extents: Vec<Extent>,
        direct: bool,
        engine: IoEngine,
    ) -> Result<Option<BundleFile>, OpenError> {
        let storage = StoragePlan {
            direct_io: direct,
            engine,
            verify: Verify::Always,
            ..crate::plan::ExecutionPlan::default().storage
        };
        BundleFile::open_with(path, model, map, extents, &storage)
    }

    /// [`BundleFile::open`] as the plan's `storage` section says (`O_DIRECT`, engine, and
    /// when reads are checked).
    pub fn open_with(
        path: &Path,
        model: &Model,
        map: &UnitMap,
        extents: Vec<Extent>,
        storage: &StoragePlan,
    ) -> Result<Option<BundleFile>, OpenError> {
        let (direct, engine) = (storage.direct_io, storage.engine);
        let Some(store) = model.store().cloned() else {
            return Ok(None);
        };
        let reads = match engine {
            IoEngine::Pread => Reads::Positional,
            #[cfg(feature = "io-uring")]
            IoEngine::Uring => Reads::Uring(Box::new(
                super::uring::Ring::new().map_err(OpenError::UringUnavailable)?,
            )),
            #[cfg(not(feature = "io-uring"))]
            IoEngine::Uring => return Err(OpenError::UringNotBuilt),
        };
        if store.pages.is_none()
            && storage.verify == Verify::Always
            && !NO_PAGE_CRCS_NOTED.swap(true, Ordering::Relaxed)
        {
            eprintln!(
                "note: {} is a neuron store without page checksums (made before format 3): its bundles are read whole, and its attention and output reads cannot be checked; convert the model again",
                path.display()
            );
        }
        let (file, _) = open_for_reads(path, direct).map_err(|source| OpenError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Some(BundleFile {
            path: path.to_path_buf(),
            file,
            store,
            map: map.clone(),
            verified: extents.iter().map(|_| AtomicBool::new(false)).collect(),
            extents,
            verify: storage.verify,
            reads,
            faults: model.read_faults().cloned(),
            issued: IssuedReads::default(),
        }))
    }

    /// Read requests and submissions handed to the kernel so far (a read the fault injector
    /// fails outright never gets there).
    pub fn issued(&self) -> IssuedCounts {
        IssuedCounts {
            requests: self.issued.requests.load(Ordering::Relaxed),
            submissions: self.issued.submissions.load(Ordering::Relaxed),
        }
    }

    /// The fault the injector (if any) decides for a read of `len` bytes at `offset`.
    fn fault(&self, offset: u64, len: usize) -> ReadFault {
        ReadFault::of(self.faults.as_deref(), offset, len)
    }

    /// Applies `faults` (one per read) to what io_uring reads `reads` returned in `out`.
    #[cfg(feature = "io-uring")]
    fn apply_faults(
        reads: &mut [(&mut [u8], u64)],
        out: &mut [std::io::Result<usize>],
        faults: &[ReadFault],
    ) {
        for (((buf, _), got), fault) in reads.iter_mut().zip(out.iter_mut()).zip(faults) {
            if *fault != ReadFault::None {
                let result = std::mem::replace(got, Ok(0));
                *got = fault.apply(&mut [&mut buf[..]], result);
            }
        }
    }

    /// When reads are checked.
    pub fn verify(&self) -> Verify {
        self.verify
    }

    /// Whether the store has page checksums (format 3), without which attention and output
    /// units cannot be checked and bundles are never read in part under [`Verify::Always`].
    pub fn has_page_checksums(&self) -> bool {
        self.store.pages.is_some()
    }

    /// Checks `read`, the bytes a whole read of unit `u` (extent `e`) returned, unless
    /// [`Verify::First`] and a read of it was checked before: a bundle against its CRC, any
    /// other unit page by page (not at all in a store without page checksums).
    fn check_whole(&self, u: usize, e: &Extent, read: &[u8]) -> Result<(), String> {
        if self.verify == Verify::First && self.verified[u].load(Ordering::Relaxed) {
            return Ok(());
        }
        match (e.bundle, &self.store.pages) {
            (Some((l, b)), _) => {
                let data = read
                    .get(e.data.clone())
                    .ok_or("read shorter than its data")?;
                self.store
                    .check_bundle(l, b, data)
                    .map_err(|err| err.to_string())?
            }
            (None, Some(pages)) => pages
                .check(&e.what, e.offset, read)
                .map_err(|err| err.to_string())?,
            (None, None) => {}
        }
        self.verified[u].store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Checks `read`, pages of extent `e` read from file offset `offset`, under
    /// [`Verify::Always`] (parts are read only once the unit's whole read was checked, so
    /// [`Verify::First`] trusts them).
    fn check_part(&self, e: &Extent, offset: u64, read: &[u8]) -> Result<(), String> {
        match (self.verify, &self.store.pages) {
            (Verify::Always, Some(pages)) => pages
                .check(&e.what, offset, read)
                .map_err(|err| err.to_string()),
            _ => Ok(()),
        }
    }

    /// Reads into `buf` from `offset` until it is full or the file ends; the bytes read.
    fn read_into(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let fault = self.fault(offset, buf.len());
        if let ReadFault::Fail(_) = fault {
            return fault.apply(&mut [], Ok(0));
        }
        self.issued.note(1, 1);
        let result = match &self.reads {
            Reads::Positional => read_full(&self.file, buf, offset),
            #[cfg(feature = "io-uring")]
            Reads::Uring(ring) => {
                let mut out = [Ok(0)];
                ring.read_all(&self.file, &mut [(&mut *buf, offset)], &mut out);
                let [result] = out;
                result
            }
        };
        match fault {
            ReadFault::None => result,
            _ => fault.apply(&mut [buf], result),
        }
    }

    /// Bytes the read of `(layer, cluster)` transfers.
    pub fn read_bytes(&self, layer: u32, cluster: u32) -> u64 {
        let u = self.map.unit(layer, cluster) as usize;
        self.extents.get(u).map_or(0, |e| e.len as u64)
    }

    /// Reads unit `(layer, cluster)` (`layer == n_layer`: the output projection) into `dst`,
    /// a slot (aligned for `O_DIRECT`), retrying once; checks a bundle's checksum.
    pub fn load(&self, layer: u32, cluster: u32, dst: &mut [u8]) -> Result<(), LoadError> {
        let u = self.map.unit(layer, cluster) as usize;
        let Some(e) = self.extents.get(u).filter(|_| layer <= self.map.n_layer) else {
            return Err(LoadError {
                what: format!("layer {layer} cluster {cluster}"),
                path: self.path.display().to_string(),
                why: "no such unit in this store".into(),
            });
        };
        let fail = |why: String| LoadError {
            what: e.what.clone(),
            path: self.path.display().to_string(),
            why,
        };
        if dst.len() < e.len {
            return Err(fail(format!(
                "slot of {} bytes < read of {}",
                dst.len(),
                e.len
            )));
        }
        let mut last = String::new();
        for _attempt in 0..2 {
            match self.read_into(&mut dst[..e.len], e.offset) {
                Ok(got) if got >= e.data.end => match self.check_whole(u, e, &dst[..got]) {
                    Ok(()) => return Ok(()),
                    Err(why) => last = why,
                },
                Ok(got) => {
                    last = format!(
                        "read of {} bytes at offset {} returned {got} (file truncated?)",
                        e.len, e.offset
                    )
                }
                Err(err) => last = format!("read of {} bytes at offset {}: {err}", e.len, e.offset),
            }
        }
        Err(fail(format!("{last}, twice")))
    }
}

impl BundleFile {
    /// Reads pages `pages` (of 4096 bytes from the unit's start; `None`: all of it) of unit
    /// `(layer, cluster)` into the same places of `dst`, its slot, retrying once; returns the
    /// bytes read. A bundle's checksum covers the bundle whole, so until one read of it has
    /// been checked it is read whole (and checked) whatever part was asked for.
    pub fn load_part(
        &self,
        layer: u32,
        cluster: u32,
        pages: Option<Range<u32>>,
        dst: &mut [u8],
    ) -> Result<u64, LoadError> {
        let u = self.map.unit(layer, cluster) as usize;
        let extent = self.extents.get(u).filter(|_| layer <= self.map.n_layer);
        let (Some(pages), Some(e)) = (pages, extent) else {
            self.load(layer, cluster, dst)?;
            return Ok(self.read_bytes(layer, cluster));
        };
        if !self.part_ready(layer, cluster) {
            self.load(layer, cluster, dst)?;
            return Ok(e.len as u64);
        }
        let span = self.part_span(e, &pages);
        if span.is_empty() {
            return Ok(0);
        }
        if dst.len() < span.end {
            return Err(self.part_error(
                e,
                &pages,
                format!("slot of {} bytes < read to {}", dst.len(), span.end),
            ));
        }
        self.read_part(e, &pages, &mut dst[span])
    }

    /// Whether some pages of unit `(layer, cluster)` may be read on their own: it is a bundle
    /// whose checksum a whole read already confirmed (until then it is read whole), and under
    /// [`Verify::Always`] the store has page checksums to check the parts with (a format-2
    /// store's bundles are then always read whole).
    pub fn part_ready(&self, layer: u32, cluster: u32) -> bool {
        let u = self.map.unit(layer, cluster) as usize;
        let checkable = self.verify == Verify::First || self.store.pages.is_some();
        checkable
            && self
                .extents
                .get(u)
                .is_some_and(|e| e.bundle.is_some() && self.verified[u].load(Ordering::Relaxed))
    }

    /// Where pages `pages` of extent `e` lie in its slot (empty past its end).
    fn part_span(&self, e: &Extent, pages: &Range<u32>) -> Range<usize> {
        let page = READ_ALIGN as usize;
        let start = (pages.start as usize).saturating_mul(page).min(e.len);
        let end = (pages.end as usize).saturating_mul(page).min(e.len);
        start..end.max(start)
    }

    fn part_error(&self, e: &Extent, pages: &Range<u32>, why: String) -> LoadError {
        LoadError {
            what: format!("{} (pages {}..{})", e.what, pages.start, pages.end),
            path: self.path.display().to_string(),
            why,
        }
    }

    /// Bytes of pages `pages` of `e` the read must return: past the bundle's data is padding,
    /// which a file may end before.
    fn part_need(&self, e: &Extent, pages: &Range<u32>) -> usize {
        let span = self.part_span(e, pages);
        e.data.end.min(span.end).saturating_sub(span.start)
    }

    /// Reads pages `pages` of `e` into `dst` (exactly their span), retrying once.
    fn read_part(&self, e: &Extent, pages: &Range<u32>, dst: &mut [u8]) -> Result<u64, LoadError> {
        let span = self.part_span(e, pages);
        let need = self.part_need(e, pages);
        let (len, offset) = (span.len(), e.offset + span.start as u64);
        let mut last = String::new();
        for _attempt in 0..2 {
            match self.read_into(&mut dst[..len], offset) {
                Ok(got) if got >= need => match self.check_part(e, offset, &dst[..got.min(len)]) {
                    Ok(()) => return Ok(len as u64),
                    Err(why) => last = why,
                },
                Ok(got) => {
                    last = format!(
                        "read of {len} bytes at offset {offset} returned {got} (file truncated?)"
                    )
                }
                Err(err) => last = format!("read of {len} bytes at offset {offset}: {err}"),
            }
        }
        Err(self.part_error(e, pages, format!("{last}, twice")))
    }

    /// Reads pages of several units at once, each `(layer, cluster, pages, dst)` with `dst`
    /// exactly the pages' span of its slot (every unit [`BundleFile::part_ready`]): with
    /// io_uring all in flight together, otherwise one after another. A read that fails or
    /// comes back short is read again on its own (with [`BundleFile::load_part`]'s retry and
    /// errors). Returns the bytes each read.
    pub fn load_parts(
        &self,
        parts: &mut [(u32, u32, Range<u32>, &mut [u8])],
    ) -> Vec<Result<u64, LoadError>> {
        let extent = |layer: u32, cluster: u32| {
            let u = self.map.unit(layer, cluster) as usize;
            self.extents.get(u).filter(|_| layer <= self.map.n_layer)
        };
        // Only the io_uring path fills it ahead of the loop below.
        #[cfg_attr(not(feature = "io-uring"), allow(unused_mut))]
        let mut done: Vec<Option<Result<u64, LoadError>>> = parts.iter().map(|_| None).collect();
        #[cfg(feature = "io-uring")]
        if let Reads::Uring(ring) = &self.reads {
            let mut reads: Vec<(&mut [u8], u64)> = Vec::with_capacity(parts.len());
            let mut which = Vec::with_capacity(parts.len());
            for (i, (layer, cluster, pages, dst)) in parts.iter_mut().enumerate() {
                let Some(e) = extent(*layer, *cluster) else {
                    continue;
                };
                let span = self.part_span(e, pages);
                if !span.is_empty() && dst.len() >= span.len() {
                    reads.push((&mut dst[..span.len()], e.offset + span.start as u64));
                    which.push(i);
                }
            }
            let mut out: Vec<std::io::Result<usize>> = reads.iter().map(|_| Ok(0)).collect();
            let faults: Vec<ReadFault> = reads
                .iter()
                .map(|(buf, offset)| self.fault(*offset, buf.len()))
                .collect();
            self.issued.note_ring(reads.len());
            ring.read_all(&self.file, &mut reads, &mut out);
            Self::apply_faults(&mut reads, &mut out, &faults);
            drop(reads);
            // A read short or failing its check is read again below, on its own.
            for (&i, got) in which.iter().zip(&out) {
                let (layer, cluster, pages, dst) = &parts[i];
                let e = extent(*layer, *cluster).expect("checked above");
                let span = self.part_span(e, pages);
                let Some(&n) = got.as_ref().ok() else {
                    continue;
                };
                let offset = e.offset + span.start as u64;
                if n >= self.part_need(e, pages)
                    && self
                        .check_part(e, offset, &dst[..n.min(span.len())])
                        .is_ok()
                {
                    done[i] = Some(Ok(span.len() as u64));
                }
            }
        }
        parts
            .iter_mut()
            .zip(done)
            .map(|((layer, cluster, pages, dst), done)| {
                if let Some(result) = done {
                    return result;
                }
                let e = extent(*layer, *cluster).ok_or_else(|| LoadError {
                    what: format!("layer {layer} cluster {cluster}"),
                    path: self.path.display().to_string(),
                    why: "no such unit in this store".into(),
                })?;
                if dst.len() < self.part_span(e, pages).len() {
                    return Err(self.part_error(e, pages, "buffer shorter than the pages".into()));
                }
                self.read_part(e, pages, dst)
            })
            .collect()
    }

    /// Whether reads of some pages of units are best issued together ([`BundleFile::load_parts`]
    /// keeps them in flight at once): with io_uring.
    pub fn batches_parts(&self) -> bool {
        #[cfg(feature = "io-uring")]
        if matches!(self.reads, Reads::Uring(_)) {
            return true;
        }
        false
    }

    /// Whether units `a` and `b` (as `(layer, cluster)`) can go in one run of
    /// [`BundleFile::load_run`]: always with io_uring (every unit its own read, all in
    /// flight together), otherwise when they lie back to back in the file, so that one vectored
    /// read fetches both.
    pub fn can_batch(&self, a: (u32, u32), b: (u32, u32)) -> bool {
        #[cfg(feature = "io-uring")]
        if matches!(self.reads, Reads::Uring(_)) {
            return true;
        }
        let (ua, ub) = (
            self.map.unit(a.0, a.1) as usize,
            self.map.unit(b.0, b.1) as usize,
        );
        match (self.extents.get(ua), self.extents.get(ub)) {
            (Some(x), Some(y)) => x.offset + x.len as u64 == y.offset,
            _ => false,
        }
    }

    /// Reads units that may go together (see [`BundleFile::can_batch`]), each into its slot:
    /// with positional reads, units back to back in one vectored read; with io_uring, one read
    /// per unit, all in flight together. When a read fails or comes back short, or a checksum
    /// fails, every unit is read again on its own (with [`BundleFile::load`]'s retry and
    /// errors): the result is the same as loading them one by one.
    pub fn load_run(&self, units: &mut [(u32, u32, &mut [u8])]) -> Vec<Result<(), LoadError>> {
        if units.len() > 1 && self.read_run(units) {
            return units.iter().map(|_| Ok(())).collect();
        }
        units
            .iter_mut()
            .map(|(layer, cluster, dst)| self.load(*layer, *cluster, dst))
            .collect()
    }

    /// [`BundleFile::load_run`] handing each unit back as soon as it is in: `done(i, buf,
    /// result)` for unit `i` of `units`. With io_uring each unit is its own read, all in flight
    /// together, and a unit is handed back the moment its read is over and checked (a unit
    /// whose read or check fails is read again on its own, with [`BundleFile::load`]'s retry and
    /// errors), in the order reads finish: compute can start on it (its slot's lock released
    /// with `buf`) while the rest of the run is still on its way. With positional reads the
    /// run's one vectored read comes first, then every unit in order.
    pub fn load_run_each<B: super::StableBuf>(
        &self,
        mut units: Vec<(u32, u32, B)>,
        mut done: impl FnMut(usize, B, Result<(), LoadError>),
    ) {
        #[cfg(feature = "io-uring")]
        if let (Reads::Uring(ring), true) = (&self.reads, units.len() > 1) {
            return self.uring_run_each(ring, units, done);
        }
        let results = {
            let mut views: Vec<(u32, u32, &mut [u8])> = units
                .iter_mut()
                .map(|(layer, cluster, buf)| (*layer, *cluster, &mut **buf))
                .collect();
            self.load_run(&mut views)
        };
        for (i, ((_, _, buf), result)) in units.into_iter().zip(results).enumerate() {
            done(i, buf, result);
        }
    }

    /// [`BundleFile::load_run_each`] with io_uring.
    #[cfg(feature = "io-uring")]
    fn uring_run_each<B: super::StableBuf>(
        &self,
        ring: &super::uring::Ring,
        units: Vec<(u32, u32, B)>,
        mut done: impl FnMut(usize, B, Result<(), LoadError>),
    ) {
        let mut unknown = Vec::new();
        let mut reads = Vec::with_capacity(units.len());
        let mut meta = Vec::with_capacity(units.len());
        for (i, (layer, cluster, buf)) in units.into_iter().enumerate() {
            let u = self.map.unit(layer, cluster) as usize;
            match self.extents.get(u) {
                Some(e) if buf.len() >= e.len && layer <= self.map.n_layer => {
                    meta.push((i, layer, cluster, u, self.fault(e.offset, e.len)));
                    reads.push((buf, e.offset, e.len));
                }
                // No such unit, or a slot too small: `load` names the error.
                _ => unknown.push((i, layer, cluster, buf)),
            }
        }
        self.issued.note_ring(reads.len());
        // Units to read again on their own once the ring is free (`load` reads through it).
        let mut again = Vec::new();
        ring.read_each(&self.file, reads, |k, mut buf, got| {
            let (i, layer, cluster, u, fault) = meta[k];
            let e = &self.extents[u];
            let got = match fault {
                ReadFault::None => got,
                _ => fault.apply(&mut [&mut buf[..e.len]], got),
            };
            if got.is_ok_and(|n| n >= e.data.end) && self.check_whole(u, e, &buf[..e.len]).is_ok() {
                done(i, buf, Ok(()));
            } else {
                again.push((i, layer, cluster, buf));
            }
        });
        for (i, layer, cluster, mut buf) in again.into_iter().chain(unknown) {
            let result = self.load(layer, cluster, &mut buf);
            done(i, buf, result);
        }
    }

    /// One vectored read of a run; true when every unit arrived whole and checked.
    fn read_run(&self, units: &mut [(u32, u32, &mut [u8])]) -> bool {
        let mut extents = Vec::with_capacity(units.len());
        for (layer, cluster, dst) in units.iter() {
            let u = self.map.unit(*layer, *cluster) as usize;
            match self.extents.get(u) {
                Some(e) if dst.len() >= e.len => extents.push((u, e)),
                _ => return false,
            }
        }
        let total: usize = extents.iter().map(|(_, e)| e.len).sum();
        let whole = match &self.reads {
            // One vectored read fetches only units lying back to back.
            Reads::Positional
                if !extents
                    .windows(2)
                    .all(|w| w[0].1.offset + w[0].1.len as u64 == w[1].1.offset) =>
            {
                false
            }
            Reads::Positional => {
                let offset = extents[0].1.offset;
                let fault = self.fault(offset, total);
                let mut bufs: Vec<&mut [u8]> = units
                    .iter_mut()
                    .zip(&extents)
                    .map(|((_, _, dst), (_, e))| &mut dst[..e.len])
                    .collect();
                let result = if let ReadFault::Fail(_) = fault {
                    Ok(0)
                } else {
                    self.issued.note(1, 1);
                    let mut slices: Vec<std::io::IoSliceMut<'_>> = bufs
                        .iter_mut()
                        .map(|b| std::io::IoSliceMut::new(b))
                        .collect();
                    rustix::io::preadv(&self.file, &mut slices, offset).map_err(Into::into)
                };
                fault.apply(&mut bufs, result).unwrap_or(0) >= total
            }
            #[cfg(feature = "io-uring")]
            Reads::Uring(ring) => {
                let mut reads: Vec<(&mut [u8], u64)> = units
                    .iter_mut()
                    .zip(&extents)
                    .map(|((_, _, dst), (_, e))| (&mut dst[..e.len], e.offset))
                    .collect();
                let mut out: Vec<std::io::Result<usize>> = reads.iter().map(|_| Ok(0)).collect();
                let faults: Vec<ReadFault> = reads
                    .iter()
                    .map(|(buf, offset)| self.fault(*offset, buf.len()))
                    .collect();
                self.issued.note_ring(reads.len());
                ring.read_all(&self.file, &mut reads, &mut out);
                Self::apply_faults(&mut reads, &mut out, &faults);
                out.iter()
                    .zip(&extents)
                    .all(|(got, (_, e))| got.as_ref().is_ok_and(|&n| n >= e.data.end))
            }
        };
        if !whole {
            return false;
        }
        // A unit failing its check sends the run to one-by-one loads, which retry and report.
        units
            .iter()
            .zip(&extents)
            .all(|((_, _, dst), (u, e))| self.check_whole(*u, e, &dst[..e.len]).is_ok())
    }
}

/// Opens `path` for reading, with `O_DIRECT` if `direct` and the file system accepts it (some
/// refuse it: the page cache then serves the reads, and the first such fallback of the process
/// prints one line on stderr saying so). Returns the file and whether its reads bypass the page
/// cache.
pub fn open_for_reads(path: &Path, direct: bool) -> std::io::Result<(File, bool)> {
    open_for_reads_with(path, direct, |p| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(p)
    })
}

/// [`open_for_reads`] with the `O_DIRECT` open given (a test forces the fallback with it).
pub fn open_for_reads_with(
    path: &Path,
    direct: bool,
    open_direct: impl FnOnce(&Path) -> std::io::Result<File>,
) -> std::io::Result<(File, bool)> {
    if direct {
        match open_direct(path) {
            Ok(file) => return Ok((file, true)),
            Err(refused) => {
                let file = File::open(path)?;
                if !DIRECT_REFUSED.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "note: {} cannot be opened with O_DIRECT ({refused}); its reads go through the page cache",
                        path.display()
                    );
                }
                return Ok((file, false));
            }
        }
    }
    Ok((File::open(path)?, false))
}

static DIRECT_REFUSED: AtomicBool = AtomicBool::new(false);
static NO_PAGE_CRCS_NOTED: AtomicBool = AtomicBool::new(false);

/// Whether a file system of this process refused `O_DIRECT` (and reads fell back to the page
/// cache, with the note [`open_for_reads`] prints once).
pub fn direct_io_refused() -> bool {
    DIRECT_REFUSED.load(Ordering::Relaxed)
}

/// Reads until `buf` is full or the file ends (retrying interrupted reads); returns the bytes
/// read.
pub fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
