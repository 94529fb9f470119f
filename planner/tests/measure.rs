//! `measure` on this machine, quick: the profile validates, round-trips through TOML, has every
//! curve it promises, and leaves no file behind; bad inputs give one-line errors. No timing
//! thresholds: these machines are shared.

use conductor_planner::hardware::{
    check_options, measure, MeasureError, MeasureOptions, MIN_FILE_BYTES, QUEUE_DEPTHS,
    REPLAY_DEPTHS, STORAGE_SIZES,
};
use conductor_runtime::plan::{HardwareProfile, MessagingProfile, Topology};
use conductor_runtime::quant::GgmlType;
use std::path::{Path, PathBuf};

fn messaging() -> MessagingProfile {
    MessagingProfile {
        local_message_ns: 150.0,
        remote_message_ns: 900.0,
        wakeup_ns: 12_000.0,
        dispatch_ns: 3_000.0,
    }
}

/// The cores this process may run on, as one class.
fn topology() -> Topology {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if ids.is_empty() {
        return Topology::uniform(1);
    }
    Topology {
        cores: ids
            .iter()
            .map(|c| (c.id as u32, "all".to_string()))
            .collect(),
    }
}

/// A fresh, empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "conductor-planner-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn entries(&self) -> usize {
        std::fs::read_dir(&self.0).unwrap().count()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn quick(dir: &Path) -> MeasureOptions {
    MeasureOptions {
        quick: true,
        storage_dir: dir.to_path_buf(),
        storage_file_bytes: 8 << 20,
        skip_storage: false,
        storage_file: None,
        storage_reads: Vec::new(),
        storage_replay_buffers: 0,
    }
}

#[test]
fn quick_measure_validates_round_trips_and_cleans_up() {
    let dir = TempDir::new("measure");
    let topo = topology();
    let mut lines = Vec::new();
    let profile = measure(&quick(dir.path()), &topo, messaging(), &mut |l| {
        lines.push(l.to_string())
    })
    .unwrap();
    profile.validate().unwrap();
    assert_eq!(dir.entries(), 0, "the storage test file must be removed");
    assert!(!lines.is_empty(), "progress lines are reported");

    let text = profile.to_toml();
    let back = HardwareProfile::from_toml(&text).unwrap();
    assert_eq!(back, profile, "TOML round trip");

    assert!(
        profile.name.starts_with("this machine: "),
        "{}",
        profile.name
    );
    assert!(profile
        .source
        .starts_with("measured by conductor profile-hw on 20"));
    assert_eq!(profile.messaging, messaging(), "messaging is copied in");
    assert!(profile.npu.is_none());
    assert!(profile.description.contains("No NPU"));

    // One class, every core of the topology, every profiled type.
    assert_eq!(profile.core_classes.len(), 1);
    let class = &profile.core_classes[0];
    assert_eq!(class.name, "all");
    let ids: Vec<u32> = topo.cores.iter().map(|(id, _)| *id).collect();
    assert_eq!(class.cores, ids);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(class.rates(ty).is_some(), "{ty} rates");
    }

    // The full storage curves.
    let s = &profile.storage;
    assert_eq!(s.random.len(), STORAGE_SIZES.len() * QUEUE_DEPTHS.len());
    for size in STORAGE_SIZES {
        for qd in QUEUE_DEPTHS {
            assert!(
                s.random
                    .iter()
                    .any(|r| r.size_bytes == size && r.queue_depth == qd),
                "random {size} QD{qd}"
            );
        }
        assert!(s.sequential.iter().any(|r| r.size_bytes == size));
    }
    assert!(profile.memory.llc_bytes > 0);
}

#[test]
fn skipped_storage_is_said_and_still_validates() {
    let opts = MeasureOptions {
        skip_storage: true,
        storage_dir: PathBuf::from("/nonexistent/never/used"),
        ..quick(Path::new("/"))
    };
    let topo = Topology {
        cores: topology().cores.into_iter().take(1).collect(),
    };
    let profile = measure(&opts, &topo, messaging(), &mut |_| {}).unwrap();
    profile.validate().unwrap();
    assert!(profile.storage.name.contains("not measured"));
    assert!(profile.description.contains("NOT measured"));
}

#[test]
fn bad_storage_dirs_are_errors_before_anything_is_measured() {
    let dir = TempDir::new("bad");
    // Progress lines start with the first measurement: none may come before these errors.
    let mut lines = Vec::new();
    let mut run = |opts: &MeasureOptions, topo: &Topology| {
        measure(opts, topo, messaging(), &mut |l| lines.push(l.to_string())).unwrap_err()
    };

    let missing = dir.path().join("missing");
    let err = run(&quick(&missing), &topology());
    assert!(matches!(err, MeasureError::StorageDir { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("storage directory {}: does not exist", missing.display())
    );

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let err = run(&quick(&file), &topology());
    assert_eq!(
        err.to_string(),
        format!("storage directory {}: is not a directory", file.display())
    );

    let mut tiny = quick(dir.path());
    tiny.storage_file_bytes = MIN_FILE_BYTES - 1;
    let err = run(&tiny, &topology());
    assert!(matches!(err, MeasureError::StorageTooSmall { .. }), "{err}");
    assert!(!err.to_string().contains('\n'));

    // A directory where no file can be created, even by root.
    #[cfg(target_os = "linux")]
    {
        let err = run(&quick(Path::new("/proc")), &topology());
        assert!(
            err.to_string()
                .starts_with("storage directory /proc: cannot create a file there: "),
            "{err}"
        );
    }

    let err = run(&quick(dir.path()), &Topology { cores: vec![] });
    assert_eq!(err.to_string(), "the topology lists no cores");

    // The same checks, alone (the CLI runs them before its own slow work).
    assert!(check_options(&quick(&missing)).is_err());
    assert!(check_options(&quick(dir.path())).is_ok());

    assert!(lines.is_empty(), "measured before failing: {lines:?}");
    assert_eq!(dir.entries(), 1, "only the test's own file is left");
}

/// A storage directory in memory (tmpfs) measures RAM: the profile must say so.
#[cfg(target_os = "linux")]
#[test]
fn memory_file_systems_are_flagged() {
    let dir = PathBuf::from("/dev/shm");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
    });
    if !is_tmpfs {
        eprintln!("/dev/shm is not a tmpfs here: nothing to check");
        return;
    }
    let mut opts = quick(&dir);
    opts.storage_file_bytes = MIN_FILE_BYTES;
    let topo = Topology {
        cores: topology().cores.into_iter().take(1).collect(),
    };
    match measure(&opts, &topo, messaging(), &mut |_| {}) {
        Ok(p) => {
            assert!(
                p.storage.name.starts_with("memory file system"),
                "{}",
                p.storage.name
            );
            assert!(p.description.contains("WARNING"), "{}", p.description);
        }
        // A tmpfs this process may not write to (read-only or full) proves nothing here.
        Err(MeasureError::StorageDir { .. } | MeasureError::StorageIo { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn storage_measured_on_an_existing_file_reads_it_and_leaves_it_as_it_was() {
    let dir = TempDir::new("existing");
    let path = dir.path().join("model.bin");
    let bytes: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    // A run's reads to replay: eight of 12 KiB and eight of 68 KiB at scattered offsets, and
    // one past the file's end (skipped, not an error).
    let mut reads: Vec<(u64, usize)> = (0..8u64)
        .flat_map(|i| [(i << 20, 12 << 10), ((i << 20) + (256 << 10), 68 << 10)])
        .collect();
    reads.push(((9 << 20) - 4096, 20 << 10));
    let opts = MeasureOptions {
        storage_file: Some(path.clone()),
        storage_reads: reads,
        // As into a cache's slots: each of the two replay threads cycles through three.
        storage_replay_buffers: 5,
        ..quick(Path::new("/nonexistent/never/used"))
    };
    let topo = Topology {
        cores: topology().cores.into_iter().take(1).collect(),
    };
    let profile = measure(&opts, &topo, messaging(), &mut |_| {}).unwrap();
    profile.validate().unwrap();
    assert!(profile.storage.random.iter().all(|r| r.mbps > 0.0));
    // The replayed sizes join the random table at each replay depth, beside the curve's own
    // sizes; the read past the end does not.
    for depth in REPLAY_DEPTHS {
        let at_depth: Vec<u64> = profile
            .storage
            .random
            .iter()
            .filter(|r| r.queue_depth == depth)
            .map(|r| r.size_bytes)
            .collect();
        for size in [12 << 10, 68 << 10] {
            assert!(
                at_depth.contains(&size),
                "{size} at QD{depth}: {at_depth:?}"
            );
        }
        assert!(
            !at_depth.contains(&(20 << 10)) && STORAGE_SIZES.iter().all(|s| at_depth.contains(s)),
            "QD{depth}: {at_depth:?}"
        );
    }
    assert!(
        profile.description.contains("replaying the 16 reads")
            && profile.description.contains("into 5 buffers in turn"),
        "{}",
        profile.description
    );
    assert!(
        profile.description.contains("model.bin") && profile.description.contains("never written"),
        "{}",
        profile.description
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is only read"
    );
    assert_eq!(dir.entries(), 1, "no test file is left beside it");

    // Too small to measure on, or missing: errors before anything is measured.
    let small = dir.path().join("small.bin");
    std::fs::write(&small, vec![0u8; 1 << 20]).unwrap();
    for bad in [small, dir.path().join("missing.bin")] {
        let opts = MeasureOptions {
            storage_file: Some(bad.clone()),
            ..quick(dir.path())
        };
        let mut lines = Vec::new();
        let err = measure(&opts, &topo, messaging(), &mut |l| {
            lines.push(l.to_string())
        });
        assert!(err.is_err(), "{}", bad.display());
        assert!(lines.is_empty(), "{lines:?}");
    }
}
