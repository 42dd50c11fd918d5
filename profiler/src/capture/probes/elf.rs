//! Function symbols of a shared library as file offsets, the form a uprobe attaches at.
//! Parsed once per file: libcuda is tens of megabytes and gets dozens of probes.
use std::{collections::HashMap, path::Path};

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

pub struct Symbols {
    offsets: HashMap<String, u64>,
}

impl Symbols {
    pub fn read(path: &Path) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        // SAFETY: a read-only private mapping; a library rewritten underneath it could change
        // what we read, never memory safety of anything but these bytes, which are parsed
        // defensively by `object`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
        let elf = object::File::parse(&*map).map_err(|e| format!("not an ELF file: {e}"))?;
        let mut offsets = HashMap::new();
        for sym in elf.dynamic_symbols().chain(elf.symbols()) {
            if sym.kind() != SymbolKind::Text || sym.is_undefined() {
                continue;
            }
            let (Ok(name), Some(index)) = (sym.name(), sym.section_index()) else {
                continue;
            };
            let Ok(section) = elf.section_by_index(index) else {
                continue;
            };
            let Some((file_offset, _)) = section.file_range() else {
                continue;
            };
            let offset = sym.address() - section.address() + file_offset;
            offsets.entry(name.to_string()).or_insert(offset);
        }
        Ok(Self { offsets })
    }

    pub fn offset(&self, name: &str) -> Option<u64> {
        self.offsets.get(name).copied()
    }
}
