//! Reading a module image: which kernels a PTX text defines, or that an image is a binary.

/// What cuModuleLoadData was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// PTX text and the `.entry` kernels it defines.
    Ptx(Vec<Entry>),
    /// A cubin (ELF) or fatbin: we cannot list its kernels, so any name resolves.
    Binary,
}

/// A kernel declared in PTX.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Whether it declares any `.param`: only then may the launch's `kernelParams[0]` be read.
    pub has_params: bool,
}

/// First bytes of an ELF cubin.
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// First word of a fatbin (little-endian 0xBA55ED50) and of the fatbin wrapper (0x466243B1).
const FATBIN_MAGICS: [u32; 2] = [0xBA55_ED50, 0x4662_43B1];

/// Classifies an image by its first four bytes.
pub fn is_binary(head: [u8; 4]) -> bool {
    head == ELF_MAGIC || FATBIN_MAGICS.contains(&u32::from_le_bytes(head))
}

/// The kernels declared with `.entry` in PTX text.
pub fn entries(ptx: &str) -> Vec<Entry> {
    let mut found: Vec<Entry> = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry") {
        rest = rest[at + ".entry".len()..].trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        rest = rest[name.len()..].trim_start();
        // The parameter list, if any, is the parenthesized text right after the name.
        let has_params = rest.starts_with('(')
            && rest
                .split_once(')')
                .is_some_and(|(list, _)| list.contains(".param"));
        if !name.is_empty() && found.iter().all(|e| e.name != name) {
            found.push(Entry { name, has_params });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_entries_in_ptx() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry spin(\n .param .u64 ns)\n{ ret; }\n\
                   .entry _Z4fillPfi (.param .u64 p) { ret; }\n.func helper() { ret; }";
        let found = entries(ptx);
        let names: Vec<&str> = found.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["spin", "_Z4fillPfi"]);
        assert!(found.iter().all(|e| e.has_params));
        assert!(entries(".version 8.0").is_empty());
        let bare = entries(".visible .entry noop()\n{ ret; }");
        assert_eq!(
            bare,
            vec![Entry {
                name: "noop".into(),
                has_params: false
            }]
        );
    }

    #[test]
    fn recognizes_binaries() {
        assert!(is_binary(*b"\x7fELF"));
        assert!(is_binary(0xBA55_ED50u32.to_le_bytes()));
        assert!(!is_binary(*b".ver"));
    }
}
