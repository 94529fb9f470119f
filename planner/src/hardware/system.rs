//! What the operating system says about the machine: CPU model, cache and clock sizes, the date.
//! Every reader returns `None` (and the caller notes a fallback) where the file is missing.

use std::time::{SystemTime, UNIX_EPOCH};

/// The LLC size assumed when sysfs does not say (a server L3 or a phone's L3 + SLC is 8–64 MiB).
pub const FALLBACK_LLC_BYTES: u64 = 32 << 20;

fn cpuinfo() -> String {
    std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()
}

/// The value of the first `key : value` line of /proc/cpuinfo.
fn cpuinfo_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key && !v.trim().is_empty()).then(|| v.trim())
    })
}

/// "AMD EPYC 9R14", or the ARM implementer/part where the kernel gives no model name.
pub fn cpu_model() -> String {
    let text = cpuinfo();
    if let Some(name) = cpuinfo_field(&text, "model name").or(cpuinfo_field(&text, "Hardware")) {
        return name.to_string();
    }
    match (
        cpuinfo_field(&text, "CPU implementer"),
        cpuinfo_field(&text, "CPU part"),
    ) {
        (Some(imp), Some(part)) => format!("{} CPU (implementer {imp}, part {part})", arch()),
        _ => format!("unknown {} CPU", arch()),
    }
}

pub fn arch() -> &'static str {
    std::env::consts::ARCH
}

/// Parses sysfs cache sizes: "32768K", "1M", "512".
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok().map(|n| n * mult)
}

/// The largest data or unified cache of cpu0, from sysfs.
pub fn llc_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter(|e| {
            let ty = std::fs::read_to_string(e.path().join("type")).unwrap_or_default();
            ty.trim() != "Instruction"
        })
        .filter_map(|e| parse_size(&std::fs::read_to_string(e.path().join("size")).ok()?))
        .max()
}

/// The clock of `core` in GHz and where it came from: cpufreq's maximum (phones, most Linux
/// machines), else /proc/cpuinfo's current "cpu MHz" (x86 guests, which have no cpufreq).
pub fn core_freq_ghz(core: u32) -> Option<(f64, &'static str)> {
    let path = format!("/sys/devices/system/cpu/cpu{core}/cpufreq/cpuinfo_max_freq");
    if let Some(khz) = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&v| v > 0.0)
    {
        return Some((khz / 1e6, "cpufreq cpuinfo_max_freq"));
    }
    let text = cpuinfo();
    // /proc/cpuinfo is a list of blocks, each starting with "processor : N".
    let mut current = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "processor" => current = v.trim().parse::<u32>().ok(),
            "cpu MHz" if current == Some(core) => {
                let mhz = v.trim().parse::<f64>().ok().filter(|&v| v > 0.0)?;
                return Some((mhz / 1e3, "/proc/cpuinfo cpu MHz"));
            }
            _ => {}
        }
    }
    None
}

/// Pins the calling thread to `core`; false when the OS refuses (core outside the cpuset).
pub fn pin_to(core: u32) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core as usize })
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
pub fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = conductor_runtime::calendar::civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(
            t.starts_with("20") && &t[4..5] == "-" && &t[7..8] == "-",
            "{t}"
        );
    }

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn cpuinfo_fields() {
        let text = "processor\t: 0\nmodel name\t: Some CPU\ncpu MHz\t\t: 2596.1\n";
        assert_eq!(cpuinfo_field(text, "model name"), Some("Some CPU"));
        assert_eq!(cpuinfo_field(text, "Hardware"), None);
    }
}
