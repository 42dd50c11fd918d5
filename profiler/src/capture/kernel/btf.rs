//! Member offsets of kernel structs, read from vmlinux BTF. Rust eBPF has no CO-RE
//! relocations, so the programs take `task_struct` offsets as load-time globals instead.
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad magic)")]
    BadMagic,
    #[error("BTF data is truncated")]
    Truncated,
    #[error("BTF kind {0} is unknown to stallscope")]
    UnknownKind(u32),
    #[error("struct {0} not found in BTF")]
    NoStruct(String),
    #[error("member {member} not found in struct {strukt}")]
    NoMember { strukt: String, member: String },
}

/// Where a member lives: its bit offset from the start of the struct, and its width in
/// bits when it is a bitfield.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberOffset {
    pub bit_offset: u32,
    pub bitfield_bits: Option<u32>,
}

impl MemberOffset {
    pub fn byte_offset(&self) -> u32 {
        self.bit_offset / 8
    }
}

const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_ENUM64: u32 = 19;

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// The header's third word: a size, or the type a pointer or typedef names.
    size_or_type: u32,
    /// Byte range of what trails the header: members, enumerators, parameters.
    members: std::ops::Range<usize>,
}

pub struct Btf<'a> {
    data: &'a [u8],
    strings: std::ops::Range<usize>,
    /// Index = type id - 1.
    types: Vec<Type>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    let b = data.get(at..at + 4).ok_or(BtfError::Truncated)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        if data.get(0..2) != Some(&[0x9f, 0xeb]) {
            return Err(BtfError::BadMagic);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = hdr_len + u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = hdr_len + u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        if data.len() < type_off + type_len || data.len() < str_off + str_len {
            return Err(BtfError::Truncated);
        }
        let mut types = Vec::new();
        let mut at = type_off;
        while at < type_off + type_len {
            let name_off = u32_at(data, at)?;
            let info = u32_at(data, at + 4)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let start = at + 12;
            let extra = match kind {
                1 | 14 | 17 => 4,
                3 => 12,
                4 | 5 | 15 | 19 => 12 * vlen,
                6 | 13 => 8 * vlen,
                2 | 7..=12 | 16 | 18 => 0,
                other => return Err(BtfError::UnknownKind(other)),
            };
            types.push(Type {
                name_off,
                kind,
                kind_flag: info >> 31 == 1,
                size_or_type: u32_at(data, at + 8)?,
                members: start..start + extra,
            });
            at = start + extra;
        }
        Ok(Self {
            data,
            strings: str_off..str_off + str_len,
            types,
        })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let s = &self.data[self.strings.clone()];
        let rest = s.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// Finds `member` in the struct named `strukt`, looking through anonymous nested structs
    /// and unions as C does.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<MemberOffset, BtfError> {
        let ty = self
            .types
            .iter()
            .find(|t| {
                t.kind == KIND_STRUCT
                    && !t.members.is_empty()
                    && self.name(t.name_off) == strukt.as_bytes()
            })
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        self.find_in(ty, member.as_bytes(), 0, 0)
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_string(),
                member: member.to_string(),
            })
    }

    fn find_in(
        &self,
        ty: &Type,
        member: &[u8],
        base_bits: u32,
        depth: u32,
    ) -> Option<MemberOffset> {
        if depth > 8 {
            return None;
        }
        for at in ty.members.clone().step_by(12) {
            let name_off = u32_at(self.data, at).ok()?;
            let type_id = u32_at(self.data, at + 4).ok()?;
            let raw = u32_at(self.data, at + 8).ok()?;
            let (bit_offset, bitfield_bits) = if ty.kind_flag {
                (raw & 0x00ff_ffff, Some(raw >> 24).filter(|&b| b != 0))
            } else {
                (raw, None)
            };
            if name_off == 0 {
                let inner = self.resolve_aggregate(type_id)?;
                if let Some(found) = self.find_in(inner, member, base_bits + bit_offset, depth + 1)
                {
                    return Some(found);
                }
            } else if self.name(name_off) == member {
                return Some(MemberOffset {
                    bit_offset: base_bits + bit_offset,
                    bitfield_bits,
                });
            }
        }
        None
    }

    /// Whether the enum named `enumeration` has an enumerator named `name` (a helper in
    /// `bpf_func_id`, a map type in `bpf_map_type`).
    pub fn has_enumerator(&self, enumeration: &str, name: &str) -> bool {
        self.types
            .iter()
            .filter(|t| {
                (t.kind == KIND_ENUM || t.kind == KIND_ENUM64)
                    && self.name(t.name_off) == enumeration.as_bytes()
            })
            .any(|t| {
                let step = if t.kind == KIND_ENUM { 8 } else { 12 };
                t.members.clone().step_by(step).any(|at| {
                    u32_at(self.data, at).is_ok_and(|off| self.name(off) == name.as_bytes())
                })
            })
    }

    /// The parameter count of the function-pointer typedef `name` (a BTF tracepoint's
    /// `btf_trace_*`, whose first parameter is the context).
    pub fn typedef_params(&self, name: &str) -> Option<usize> {
        let typedef = self
            .types
            .iter()
            .find(|t| t.kind == KIND_TYPEDEF && self.name(t.name_off) == name.as_bytes())?;
        let mut ty = self.by_id(typedef.size_or_type)?;
        for _ in 0..4 {
            match ty.kind {
                KIND_PTR | KIND_TYPEDEF => ty = self.by_id(ty.size_or_type)?,
                KIND_FUNC_PROTO => return Some(ty.members.len() / 8),
                _ => return None,
            }
        }
        None
    }

    fn by_id(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    fn resolve_aggregate(&self, id: u32) -> Option<&Type> {
        let ty = self.types.get((id as usize).checked_sub(1)?)?;
        (ty.kind == KIND_STRUCT || ty.kind == KIND_UNION).then_some(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds BTF for: struct inner { int a; }; struct task_struct { int pid; union { struct
    /// inner; }; unsigned in_iowait:1 at bit 97; }.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0task_struct\0pid\0in_iowait\0";
        let s = |name: &str| string_at(strings, name);
        let mut types: Vec<u32> = vec![];
        // 1: int
        types.extend([s("int"), 1 << 24, 4, 32]);
        // 2: struct inner { int a; }
        types.extend([s("inner"), (4 << 24) | 1, 4, s("a"), 1, 0]);
        // 3: anonymous union { struct inner; } (an anonymous member: its fields are visible)
        types.extend([0, (5 << 24) | 1, 4, 0, 2, 0]);
        // 4: struct task_struct, kind_flag set (bitfield member)
        types.extend([s("task_struct"), (1 << 31) | (4 << 24) | 3, 16]);
        types.extend([s("pid"), 1, 32, 0, 3, 64, s("in_iowait"), 1, (1 << 24) | 97]);
        btf_of(&types, strings)
    }

    /// The offset of `name` in a string section that holds it between NULs.
    fn string_at(strings: &[u8], name: &str) -> u32 {
        let pat = format!("\0{name}\0");
        strings
            .windows(pat.len())
            .position(|w| w == pat.as_bytes())
            .unwrap() as u32
            + 1
    }

    fn btf_of(types: &[u32], strings: &[u8]) -> Vec<u8> {
        let type_bytes: Vec<u8> = types.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![0x9f, 0xeb, 1, 0];
        for v in [
            24u32,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(v.to_le_bytes());
        }
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    #[test]
    fn finds_plain_nested_and_bitfield_members() {
        let data = sample();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(
            btf.member_offset("task_struct", "pid")
                .unwrap()
                .byte_offset(),
            4
        );
        assert_eq!(
            btf.member_offset("task_struct", "a").unwrap().byte_offset(),
            8
        );
        let io = btf.member_offset("task_struct", "in_iowait").unwrap();
        assert_eq!((io.bit_offset, io.bitfield_bits), (97, Some(1)));
        assert!(matches!(
            btf.member_offset("task_struct", "nope"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("mm_struct", "pid"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert_eq!(Btf::parse(b"hello").err(), Some(BtfError::BadMagic));
        let data = sample();
        for cut in 0..data.len() {
            let _ = Btf::parse(&data[..cut]).map(|b| b.member_offset("task_struct", "pid"));
        }
    }

    #[test]
    fn finds_enumerators_and_a_tracepoints_parameters() {
        let strings = b"\0bpf_func_id\0BPF_FUNC_unspec\0BPF_FUNC_loop\0btf_trace_sched_switch\0";
        let s = |name: &str| string_at(strings, name);
        let mut types: Vec<u32> = vec![];
        // 1: enum bpf_func_id { BPF_FUNC_unspec = 0, BPF_FUNC_loop = 181 }
        types.extend([s("bpf_func_id"), (6 << 24) | 2, 4]);
        types.extend([s("BPF_FUNC_unspec"), 0, s("BPF_FUNC_loop"), 181]);
        // 2: func_proto (void *, bool, prev, next, unsigned int): five parameters
        types.extend([0, (13 << 24) | 5, 0]);
        types.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // 3: pointer to 2; 4: typedef btf_trace_sched_switch -> 3
        types.extend([0, 2 << 24, 2]);
        types.extend([s("btf_trace_sched_switch"), 8 << 24, 3]);
        let data = btf_of(&types, strings);
        let btf = Btf::parse(&data).unwrap();
        assert!(btf.has_enumerator("bpf_func_id", "BPF_FUNC_loop"));
        assert!(!btf.has_enumerator("bpf_func_id", "BPF_FUNC_task_pt_regs"));
        assert!(!btf.has_enumerator("bpf_map_type", "BPF_FUNC_loop"));
        assert_eq!(btf.typedef_params("btf_trace_sched_switch"), Some(5));
        assert_eq!(btf.typedef_params("btf_trace_sched_wakeup"), None);
    }
}
