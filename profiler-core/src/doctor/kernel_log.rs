//! The kernel log's GPU trouble: NVRM errors, Xid events, a GPU fallen off the bus, PCIe bus
//! errors. Records come from `/dev/kmsg` (`PRIO,SEQ,USEC,FLAGS;TEXT`), as `dmesg` reads them.
use std::collections::BTreeMap;

use super::{Check, Status};

/// One kernel log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    /// Microseconds since boot (the kernel's printk clock, CLOCK_MONOTONIC).
    pub usec: u64,
    pub text: String,
}

/// A `/dev/kmsg` record: the header up to `;`, then the text; continuation lines (` KEY=V`)
/// are dropped. `None` for anything else.
pub fn parse_record(raw: &str) -> Option<Record> {
    let (header, rest) = raw.split_once(';')?;
    let mut fields = header.split(',');
    let _prio: u32 = fields.next()?.trim().parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let usec = fields.next()?.parse().ok()?;
    let text = rest.lines().next().unwrap_or("").trim_end().to_owned();
    Some(Record { seq, usec, text })
}

/// What an Xid means, and how bad it is, after NVIDIA's Xid catalogue.
pub fn xid_meaning(xid: u32) -> (&'static str, Status) {
    use Status::{Fail, Warn};
    match xid {
        13 => (
            "graphics engine exception (often the application: an out-of-range access)",
            Warn,
        ),
        31 => (
            "GPU memory page fault (usually the application: an illegal address)",
            Warn,
        ),
        32 => ("invalid or corrupted push buffer stream", Warn),
        38 => ("driver firmware error", Fail),
        43 => (
            "GPU stopped processing (the channel was reset; usually the application)",
            Warn,
        ),
        45 => (
            "preemptive cleanup after earlier errors (a process was killed)",
            Warn,
        ),
        48 => ("double-bit ECC error (uncorrectable memory error)", Fail),
        61 => ("internal micro-controller breakpoint/warning", Warn),
        62 => ("internal micro-controller halt", Fail),
        63 => ("ECC page retirement or row remapping recorded", Warn),
        64 => ("ECC page retirement or row remapping failed", Fail),
        68 => ("video processor exception", Warn),
        69 => ("graphics engine class error", Warn),
        74 => ("NVLink error", Fail),
        79 => ("GPU has fallen off the bus", Fail),
        92 => ("high single-bit ECC error rate", Warn),
        94 => (
            "contained ECC error (the application on that memory was stopped)",
            Warn,
        ),
        95 => (
            "uncontained ECC error (every application on the GPU is affected; reset it)",
            Fail,
        ),
        109 => ("context switch timeout", Warn),
        119 => ("GSP firmware RPC timeout", Fail),
        120 => ("GSP firmware error", Fail),
        121 => ("C2C (chip-to-chip) link error", Fail),
        140 => ("unrecovered ECC error", Fail),
        154 => (
            "GPU recovery action changed (a reset or reboot is required)",
            Fail,
        ),
        _ => ("see NVIDIA's Xid catalogue", Warn),
    }
}

/// What a line says, if it is GPU trouble.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Xid {
        xid: u32,
        /// `PCI:0000:3b:00` as the driver writes it.
        device: String,
    },
    FallenOffTheBus {
        device: String,
    },
    /// `RmInitAdapter failed`, an API mismatch between the module and user space, and the
    /// like: the driver could not drive the GPU.
    DriverError,
    PcieBusError {
        fatal: bool,
    },
}

/// The PCI address after `PCI:` (NVRM's spelling) or `GPU at `.
fn device_in(text: &str) -> String {
    let from = text
        .find("PCI:")
        .map(|i| &text[i..])
        .or_else(|| text.find("GPU at ").map(|i| &text[i + 7..]));
    from.map(|s| {
        s.split(|c: char| c == ')' || c.is_whitespace() || c == ',')
            .next()
            .unwrap_or("")
            .trim_end_matches(':')
            .to_owned()
    })
    .unwrap_or_default()
}

pub fn classify(text: &str) -> Option<Event> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = text.find("NVRM: Xid") {
        let rest = &text[i + "NVRM: Xid".len()..];
        let after = rest.split_once("):").map_or(rest, |(_, a)| a);
        let xid = after
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())?;
        return Some(Event::Xid {
            xid,
            device: device_in(text),
        });
    }
    if lower.contains("fallen off the bus") {
        return Some(Event::FallenOffTheBus {
            device: device_in(text),
        });
    }
    if text.contains("NVRM:")
        && [
            "rminitadapter failed",
            "api mismatch",
            "failed to allocate",
            "gpu is lost",
            "unable to",
            "no nvidia gpu found",
        ]
        .iter()
        .any(|w| lower.contains(w))
    {
        return Some(Event::DriverError);
    }
    if lower.contains("pcie bus error") || lower.contains("aer: ") {
        let fatal = lower.contains("uncorrected (fatal)") || lower.contains("severity=fatal");
        return Some(Event::PcieBusError { fatal });
    }
    None
}

/// How many of one kind, the newest line, and when.
#[derive(Default)]
struct Seen {
    count: usize,
    last: String,
    last_usec: u64,
}

impl Seen {
    fn add(&mut self, r: &Record) {
        self.count += 1;
        self.last.clone_from(&r.text);
        self.last_usec = r.usec;
    }
}

fn age(now_usec: u64, usec: u64) -> String {
    let s = now_usec.saturating_sub(usec) / 1_000_000;
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        _ => format!("{:.1} h ago", s as f64 / 3600.0),
    }
}

/// The kernel-log checks over `records` (those the caller kept: since boot, or since a
/// moment), at `now_usec` on the same clock. `scope` says which lines were read, for the
/// evidence of a clean log.
pub fn checks(records: &[Record], now_usec: u64, scope: &str) -> Vec<Check> {
    let mut xids: BTreeMap<(u32, String), Seen> = BTreeMap::new();
    let mut fallen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut driver: Option<Seen> = None;
    let mut pcie: [Option<Seen>; 2] = [None, None];
    for r in records {
        match classify(&r.text) {
            Some(Event::Xid { xid, device }) => xids.entry((xid, device)).or_default().add(r),
            Some(Event::FallenOffTheBus { device }) => fallen.entry(device).or_default().add(r),
            Some(Event::DriverError) => driver.get_or_insert_default().add(r),
            Some(Event::PcieBusError { fatal }) => {
                pcie[usize::from(fatal)].get_or_insert_default().add(r)
            }
            None => {}
        }
    }
    let mut out = Vec::new();
    for ((xid, device), s) in &xids {
        let (meaning, status) = xid_meaning(*xid);
        let evidence = format!(
            "Xid {xid} on {}: {meaning}; {} time(s), last {}: \"{}\"",
            if device.is_empty() { "a GPU" } else { device },
            s.count,
            age(now_usec, s.last_usec),
            s.last
        );
        let fix = match status {
            Status::Fail => {
                "drain the GPU and reset it (nvidia-smi -r) or reboot; if it recurs, check its \
                 cooling, power and PCIe seating, then have it replaced"
            }
            _ => {
                "usually the application (check its CUDA errors); if it recurs across jobs, \
                 treat the GPU as suspect"
            }
        };
        out.push(Check::new("kernel log: Xid", status, evidence).fix(fix));
    }
    for (device, s) in &fallen {
        out.push(Check::fail(
            "kernel log: GPU fallen off the bus",
            format!(
                "{}: {} time(s), last {}: \"{}\"",
                if device.is_empty() { "a GPU" } else { device },
                s.count,
                age(now_usec, s.last_usec),
                s.last
            ),
            "the GPU dropped off PCIe (overheating, power or a loose link): check temperature \
             and power logs, reseat or move the card, then reboot",
        ));
    }
    if let Some(s) = &driver {
        out.push(Check::fail(
            "kernel log: NVRM errors",
            format!(
                "{} driver error line(s), last {}: \"{}\"",
                s.count,
                age(now_usec, s.last_usec),
                s.last
            ),
            "read dmesg | grep -i nvrm; reinstall the driver matching the kernel (disable \
             Secure Boot or sign the module, blacklist nouveau)",
        ));
    }
    for (fatal, s) in pcie.iter().enumerate() {
        let Some(s) = s else { continue };
        let evidence = format!(
            "{} {} PCIe bus error line(s), last {}: \"{}\"",
            s.count,
            if fatal == 1 { "fatal" } else { "corrected" },
            age(now_usec, s.last_usec),
            s.last
        );
        let fix = "signal integrity: reseat the card, avoid risers and extenders, check the \
                   slot's width in the BIOS";
        out.push(if fatal == 1 {
            Check::fail("kernel log: PCIe bus errors", evidence, fix)
        } else {
            Check::warn("kernel log: PCIe bus errors", evidence, fix)
        });
    }
    if out.is_empty() {
        out.push(Check::pass(
            "kernel log",
            format!(
                "no NVRM error, Xid, fallen-off-the-bus or PCIe bus error in {} line(s) {scope}",
                records.len()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(usec: u64, text: &str) -> Record {
        Record {
            seq: usec,
            usec,
            text: text.into(),
        }
    }

    #[test]
    fn kmsg_records_parse_and_continuations_drop() {
        let r =
            parse_record("3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n SUBSYSTEM=pci")
                .unwrap();
        assert_eq!((r.seq, r.usec), (1234, 5678901));
        assert_eq!(r.text, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1");
        assert_eq!(parse_record("garbage"), None);
        assert_eq!(parse_record("x,1,2,-;t"), None);
    }

    #[test]
    fn xids_fallen_gpus_and_bus_errors_are_told_apart() {
        assert_eq!(
            classify("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."),
            Some(Event::Xid {
                xid: 79,
                device: "PCI:0000:3b:00".into()
            })
        );
        assert_eq!(
            classify("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus."),
            Some(Event::FallenOffTheBus {
                device: "PCI:0000:3b:00".into()
            })
        );
        assert_eq!(
            classify("NVRM: RmInitAdapter failed! (0x26:0xffff:1601)"),
            Some(Event::DriverError)
        );
        assert_eq!(
            classify(
                "pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected, type=Physical Layer"
            ),
            Some(Event::PcieBusError { fatal: false })
        );
        assert_eq!(
            classify("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received"),
            Some(Event::PcieBusError { fatal: true })
        );
        assert_eq!(
            classify("NVRM: loading NVIDIA UNIX x86_64 Kernel Module 570.86.15"),
            None
        );
        assert_eq!(classify("eth0: link up"), None);
    }

    #[test]
    fn a_fatal_xid_fails_and_says_what_it_means() {
        let records = [
            rec(
                1_000_000,
                "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, DBE (double bit error)",
            ),
            rec(
                2_000_000,
                "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, DBE (double bit error)",
            ),
            rec(
                3_000_000,
                "NVRM: Xid (PCI:0000:5e:00): 13, pid=8, Graphics Exception",
            ),
        ];
        let out = checks(&records, 62_000_000, "since boot");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].status, Status::Warn, "{:?}", out[0]);
        assert!(out[0].evidence.contains("Xid 13"));
        assert_eq!(out[1].status, Status::Fail);
        assert!(
            out[1].evidence.contains("double-bit ECC"),
            "{}",
            out[1].evidence
        );
        assert!(
            out[1].evidence.contains("2 time(s), last 60 s ago"),
            "{}",
            out[1].evidence
        );
    }

    #[test]
    fn a_clean_log_passes_and_says_how_much_it_read() {
        let out = checks(&[rec(1, "usb 1-1: new device")], 5, "since boot");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].status, Status::Pass);
        assert!(out[0].evidence.contains("1 line(s) since boot"));
    }
}
