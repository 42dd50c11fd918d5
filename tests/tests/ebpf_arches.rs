//! The eBPF object for each architecture the binary is built for: aya-build sets
//! `bpf_target_arch` from the target, and the programs read registers through
//! `profiler-ebpf/src/regs.rs`. Both objects are built here as aya-build builds them and parsed
//! with aya-obj (nothing is loaded): the same programs in the same sections, the CUDA entry
//! program reading each architecture's own registers, and the programs that read no user
//! registers identical. The binaries `cargo xtask dist` makes carry their own architecture's
//! object.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use aya_obj::Object;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds the programs for `arch` as profiler/build.rs does, into target/ebpf-ARCH.
fn build(arch: &str) -> Vec<u8> {
    let target_dir = repo().join("target").join(format!("ebpf-{arch}"));
    let flags = format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf");
    let out = Command::new("rustup")
        .args(["run", "nightly", "cargo", "build", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(repo().join("profiler-ebpf"))
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("running rustup (the nightly toolchain and bpf-linker: `cargo xtask setup`)");
    assert!(
        out.status.success(),
        "building the eBPF programs for {arch}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let object = target_dir.join("bpfel-unknown-none/release/stallscope");
    std::fs::read(&object).unwrap_or_else(|e| panic!("{}: {e}", object.display()))
}

struct Programs {
    /// Program name → its section, as aya-obj names it.
    sections: BTreeMap<String, String>,
    /// Program name → its instructions, as (opcode, registers, offset, immediate).
    code: BTreeMap<String, Vec<(u8, u8, i16, i32)>>,
}

fn programs(bytes: &[u8]) -> Programs {
    let obj = Object::parse(bytes).expect("aya-obj parses the object");
    let mut sections = BTreeMap::new();
    let mut code = BTreeMap::new();
    for (name, prog) in &obj.programs {
        sections.insert(name.clone(), format!("{:?}", prog.section));
        let f = &obj.functions[&prog.function_key()];
        let insns = f
            .instructions
            .iter()
            .map(|i| (i.code, (i.src_reg() << 4) | i.dst_reg(), i.off, i.imm))
            .collect();
        code.insert(name.clone(), insns);
    }
    Programs { sections, code }
}

/// The offsets of the 64-bit loads (`ldxdw`) a program makes: where it reads `pt_regs`.
fn load_offsets(code: &[(u8, u8, i16, i32)]) -> BTreeSet<i16> {
    const LDXDW: u8 = 0x79;
    code.iter().filter(|i| i.0 == LDXDW).map(|i| i.2).collect()
}

#[test]
fn each_architecture_gets_the_same_programs_reading_its_own_registers() {
    let x86 = programs(&build("x86_64"));
    let arm = programs(&build("aarch64"));
    assert_eq!(
        x86.sections, arm.sections,
        "the two objects' programs or sections differ"
    );
    for name in [
        "sched_switch",
        "cpu_sample",
        "cuda_enter",
        "cuda_exit",
        "dl_debug_state",
    ] {
        assert!(
            x86.sections.contains_key(name),
            "no {name}: {:?}",
            x86.sections.keys()
        );
    }

    // x86-64's pt_regs: rdi 112, rsi 104, rdx 96, rcx 88, r8 72, r9 64, rsp 152; aarch64's
    // user_pt_regs: x0-x6 at 0-48, the link register x30 at 240, sp at 248.
    let enter_x86 = load_offsets(&x86.code["cuda_enter"]);
    let enter_arm = load_offsets(&arm.code["cuda_enter"]);
    for off in [112, 104, 96, 88, 72, 64, 152] {
        assert!(
            enter_x86.contains(&off),
            "x86-64 cuda_enter never loads +{off}: {enter_x86:?}"
        );
    }
    for off in [0, 8, 16, 24, 32, 40, 48, 240, 248] {
        assert!(
            enter_arm.contains(&off),
            "aarch64 cuda_enter never loads +{off}: {enter_arm:?}"
        );
    }
    assert!(
        !enter_arm.contains(&152) && !enter_arm.contains(&112),
        "aarch64 cuda_enter reads x86-64's rsp or rdi: {enter_arm:?}"
    );
    // x86-64's rax at 80, aarch64's x0 at 0.
    assert!(load_offsets(&x86.code["cuda_exit"]).contains(&80));
    assert!(load_offsets(&arm.code["cuda_exit"]).contains(&0));

    // Programs that read no user registers are the same code on both.
    for name in ["sched_process_exec", "block_rq_complete"] {
        assert_eq!(
            x86.code[name], arm.code[name],
            "{name} differs between the architectures"
        );
    }
}

/// The eBPF object a stallscope binary carries: the ELF file for machine EM_BPF (247) inside
/// it, up to the end of its section headers (LLVM writes them last).
fn embedded_object(bin: &[u8]) -> &[u8] {
    let at = bin
        .windows(4)
        .enumerate()
        .skip(1)
        .filter(|(_, w)| *w == b"\x7fELF")
        .map(|(i, _)| i)
        .find(|&i| bin.get(i + 18..i + 20) == Some(&247u16.to_le_bytes()[..]))
        .expect("no eBPF object inside the binary");
    let field = |off: usize, len: usize| {
        let b = &bin[at + off..at + off + len];
        b.iter()
            .rev()
            .fold(0usize, |acc, &x| (acc << 8) | x as usize)
    };
    let (shoff, shentsize, shnum) = (field(0x28, 8), field(0x3a, 2), field(0x3c, 2));
    &bin[at..at + shoff + shentsize * shnum]
}

/// `cargo xtask dist`'s binaries, unpacked from their tarballs: each carries the object built
/// for its own architecture.
#[test]
fn each_release_binary_carries_its_own_architectures_programs() {
    let dist =
        std::env::var_os("STALLSCOPE_DIST").map_or_else(|| repo().join("dist"), PathBuf::from);
    let scratch = std::env::temp_dir().join(format!("ebpf-arches-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for (arch, rax_or_x0) in [("x86_64", 80), ("aarch64", 0)] {
        let tarball = std::fs::read_dir(&dist)
            .unwrap_or_else(|e| panic!("{}: {e} (`cargo xtask dist`)", dist.display()))
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.to_string_lossy()
                    .ends_with(&format!("-{arch}-linux.tar.gz"))
            })
            .unwrap_or_else(|| panic!("no {arch} tarball in {}", dist.display()));
        let out = Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&scratch)
            .arg("--wildcards")
            .arg("*/stallscope")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = tarball.file_name().unwrap().to_string_lossy().into_owned();
        let bin = std::fs::read(
            scratch
                .join(name.trim_end_matches(".tar.gz"))
                .join("stallscope"),
        )
        .unwrap();
        let object = programs(embedded_object(&bin));
        assert!(
            object.code.contains_key("cuda_enter"),
            "{arch}: {:?}",
            object.code.keys()
        );
        assert!(
            load_offsets(&object.code["cuda_exit"]).contains(&rax_or_x0),
            "the {arch} binary's cuda_exit does not read its return register (+{rax_or_x0})"
        );
        let enter = load_offsets(&object.code["cuda_enter"]);
        let (own, other) = if arch == "x86_64" {
            (152, 248)
        } else {
            (248, 152)
        };
        assert!(
            enter.contains(&own) && !enter.contains(&other),
            "the {arch} binary's cuda_enter reads the other architecture's stack pointer: {enter:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
